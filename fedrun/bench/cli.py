"""Seconds per round, after warm-up, for the vectorized and the loop engine in the same process.

Default setting (issue 2): synthetic data, 100 clients, MLP 60-20-10, 10 clients per round, tau=20,
batch 20, evaluation of all 100 clients every round; FedAvg and Per-FedAvg (fo, hf).
    python -m fedrun.bench.cli            (or fedrun-bench)  [--rounds N] [--device cpu|cuda]
pFedMe setting (issue 4; pFedMe's Table 1, official protocol): the same data and model, ALL 100
clients train every round (R=tau=20 local rounds of K=5 inner steps, batch 20), 10 aggregated
(sample-weighted), PM = local models, every client evaluated every round:
    python -m fedrun.bench.cli --algos pfedme
CIFAR setting (issue 5; paper 004's official CIFAR-10 ACID settings): random CIFAR-shaped data in a
FederatedData of the ACID shape (100 devices x 500 training / 100 test images 3x32x32, 10 classes,
5 per device, crop+flip augmentation of training batches), paper 004's CNN, 10 devices per round,
K=tau=50 local steps of batch 50, every device evaluated every --eval-every rounds (train nothing real:
the numbers time the computation, not learning):
    python -m fedrun.bench.cli --setting cifar [--algos fedavg] [--rounds 5 --loop-rounds 2] [--clients 100]
Both: `--repeats N` times each engine N times, alternating, and prints the medians and the range of
the N loop/vmap ratios (one pair of timings on a shared machine can be off by 30%).
fedrun against the authors' code (issue 11): pFedMe DNN at pFedMe's Table 1 synthetic setting (official protocol),
fedrun's vmap engine before and after CharlieDinh/pFedMe's main.py in the same process tree, same thread count;
PATH is a work tree of their repository (their Synthetic data is generated there first if missing):
    python -m fedrun.bench.cli --authors PATH [--rounds 20 --authors-rounds 3 --warmup 3]
Seeds batched (issue 11, `hydra/launcher=batched`): wall time of 1, 5, 10 seeds as one computation
against one seed, for pFedMe DNN (official protocol) and the default Per-FedAvg run (fedrun.bench.seeds):
    python -m fedrun.bench.cli --seeds 1,5,10 [--rounds 3] [--seed-settings pfedme,perfedavg]
Minibatch draws (sampling=): seconds to draw one round's minibatch rows (fedrun.simulate.sample_round)
under each sampling=, for --clients-per-round devices of --train-per-client rows, tau=--tau (default 50)
steps of one batch of --batch rows (paper 004's CIFAR round by default; the draw depends on row counts only):
    python -m fedrun.bench.cli --setting draws [--train-per-client 5000]
Today's PFL models at their data's shapes (fedrun.bench.settings: ResNet-18 on CIFAR-100-shaped images, the
LEAF LSTM on 80-character sequences, TextCNN on AG News-shaped token rows), vmap and loop s/round, peak memory:
    python -m fedrun.bench.cli --setting resnet|shakespeare|agnews [--tiny] [--rounds 3 --loop-rounds 1]
The first GPU's numbers (fedrun.bench.gpu_check): engine agreement on cuda for every device branch, the default run,
the CIFAR ACID preset, the CIFAR bench and batched seeds, one table; refused (exit 2) without CUDA:
    python -m fedrun.bench.cli --gpu-check
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

# isort: off
from .. import openmp  # noqa: F401 - before torch: GOMP_SPINCOUNT, as `fedrun` sets it (fedrun/openmp.py)
# isort: on

import torch

from ..algorithms import names
from ..args import ArgumentParser
from ..data import ClientSplit, FederatedData, synthetic
from ..device import keep_freed_memory
from ..models import CNN
from ..simulate import SAMPLING, Schedule, sample_round
from .common import AGGREGATE, ALGOS, CIFAR_ALGOS, bench_algo, cifar_like, sync, time_rounds


def _unknown(algos: str, settings: dict) -> list[str]:
    return [a for a in algos.split(",") if a not in settings and a not in names()]


def main(argv=None) -> None:
    ap = ArgumentParser(prog="fedrun-bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds (default 20; --seeds: 3)")
    ap.add_argument("--loop-rounds", type=int, default=5, help="timed rounds of the loop engine (0: vmap only)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1,
                    help="time each engine this many times, alternating; print medians and the ratios' range")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--algos", default=None,
                    help="comma-separated bench settings or conf/algo names (synthetic default: fedavg,perfedavg-fo,"
                         f"perfedavg-hf,perfedavg-exact, from {','.join(ALGOS)}; cifar default: fedavg, from "
                         f"{','.join(CIFAR_ALGOS)}; any of {','.join(names())})")
    ap.add_argument("--tau", type=int, default=None, help="local steps (default: synthetic 20, cifar and draws 50)")
    ap.add_argument("--personalize-batch", type=int, default=None,
                    help="test-time adaptation on a minibatch of this size (default: all training rows)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--tiny", action="store_true",
                    help="--setting resnet|shakespeare|agnews: a few clients and rows, narrow models (a CPU's minutes)")
    ap.add_argument("--setting", choices=["synthetic", "cifar", "draws", "resnet", "shakespeare", "agnews"],
                    default="synthetic",
                    help="synthetic: issue 2's MLP setting | cifar: paper 004's CNN on CIFAR-shaped random data | "
                         "draws: one round's minibatch draws under each sampling= | resnet, shakespeare, agnews: "
                         "ResNet-18 / the LSTM / TextCNN at their data's shapes (fedrun.bench.settings)")
    ap.add_argument("--clients", type=int, default=100, help="cifar: devices (default 100)")
    ap.add_argument("--train-per-client", type=int, default=500, help="cifar, draws: training images (rows) per device")
    ap.add_argument("--test-per-client", type=int, default=100, help="cifar: test images per device")
    ap.add_argument("--clients-per-round", type=int, default=10, help="cifar, draws: active devices per round")
    ap.add_argument("--batch", type=int, default=50, help="cifar, draws: batch size")
    ap.add_argument("--eval-every", type=int, default=1, help="cifar: evaluate all devices every this many rounds")
    ap.add_argument("--authors", default=None, metavar="PATH",
                    help="time CharlieDinh/pFedMe's main.py (a work tree at PATH) against fedrun's pFedMe DNN")
    ap.add_argument("--authors-rounds", type=int, default=3, help="--authors: rounds of their code timed after warm-up")
    ap.add_argument("--seeds", default=None, metavar="N,N,...",
                    help="seeds batched: s/round of each number of seeds trained together (e.g. 1,5,10)")
    ap.add_argument("--seed-settings", default="pfedme,perfedavg", help="--seeds: settings (pfedme, perfedavg)")
    ap.add_argument("--gpu-check", action="store_true",
                    help="on a CUDA machine: engine agreement (every device branch), the default run, the CIFAR ACID "
                         "preset, the CIFAR bench and batched seeds, in one table (fedrun.bench.gpu_check); refused on "
                         "a CPU")
    ap.add_argument("--gpu-check-device", default="cuda", help=argparse.SUPPRESS)  # cpu: the tests' tiny run
    ap.add_argument("--gpu-check-parts", default=None, help=argparse.SUPPRESS)  # a subset, in this order
    ap.add_argument("--compile", action="store_true",
                    help="s/round of training rounds under compile=none|default|graphs and precision=fp32|bf16, the "
                         "first (compiling) round apart, the GPU's busy fraction, and each mode's difference to eager "
                         "(fedrun.bench.compile); --rounds timed (default 10) after --warmup")
    ap.add_argument("--compile-settings", default="default-fedavg,default-fo,pfedme,cifar-acid,seeds5",
                    help="--compile: settings, from default-fedavg, default-fo, pfedme, cifar-acid, seeds5")
    ap.add_argument("--compile-modes", default=None,
                    help="--compile: modes (default: CUDA eager,compiled,graphs,bf16,graphs+bf16; CPU "
                         "eager,compiled,bf16)")
    ap.add_argument("--epochs", action="store_true",
                    help="a round in local epochs on uneven clients against the same round masked and a steps round "
                         "of the same total client steps (fedrun.bench.epochs); --rounds timed (default 3) after "
                         "--warmup")
    ap.add_argument("--epochs-settings", default="synthetic,mnist", help="--epochs: synthetic, mnist")
    ap.add_argument("--mnist-root", default=None, help="--epochs mnist: the folder holding MNIST/raw")
    args = ap.parse_args(argv)
    if args.gpu_check:
        from . import gpu_check

        raise SystemExit(gpu_check.main(args.gpu_check_device, args.gpu_check_parts))
    if args.repeats < 1:
        ap.refuse("--repeats", args.repeats, "must be at least 1")
    if args.seeds and not all(n.strip().isdigit() and int(n) >= 1 for n in args.seeds.split(",")):
        ap.refuse("--seeds", args.seeds, "must be a comma-separated list of positive integers, e.g. 1,5,10")
    try:
        torch.device(args.device)
    except RuntimeError:
        ap.refuse("--device", args.device, "allowed: cpu, cuda, cuda:N")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        ap.refuse("--device", args.device, "this machine has no CUDA GPU torch can use; allowed here: cpu")
    for name, low in (("rounds", 1), ("loop_rounds", 0), ("warmup", 0), ("tau", 1), ("personalize_batch", 1),
                      ("threads", 0), ("clients", 1), ("train_per_client", 1), ("test_per_client", 1),
                      ("clients_per_round", 1), ("batch", 1), ("eval_every", 1), ("authors_rounds", 1)):
        v = getattr(args, name)
        if v is not None and v < low:  # one line, as fedrun's option errors
            ap.refuse(f"--{name.replace('_', '-')}", v, f"must be at least {low}")
    if args.repeats > 1 and (args.seeds or args.authors):
        ap.error("--repeats times the vmap and loop engines; it does not apply to "
                 f"--{'seeds' if args.seeds else 'authors'}")
    keep_freed_memory()  # as a run does (fedrun.run.runner)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.seeds:
        from . import seeds as bench_seeds

        return bench_seeds.main([int(n) for n in args.seeds.split(",")], args.rounds or 3,
                                args.seed_settings.split(","),
                                args.device)
    if args.epochs:
        from . import epochs as bench_epochs

        bad = [n for n in args.epochs_settings.split(",") if n not in ("synthetic", "mnist")]
        if bad:
            ap.refuse("--epochs-settings", args.epochs_settings, "allowed: synthetic, mnist")
        algos = args.algos.split(",") if args.algos else ["fedavg", "fedrep", "ditto"]
        bench_epochs.main(args.epochs_settings.split(","), algos, args.rounds or 3, args.warmup, args.device,
                          args.mnist_root)
        return None
    if args.compile:
        from . import compile as bench_compile

        bad = [n for n in args.compile_settings.split(",") if n not in bench_compile.SETTINGS]
        if bad:
            ap.refuse("--compile-settings", args.compile_settings, f"allowed: {', '.join(bench_compile.SETTINGS)}")
        modes = args.compile_modes.split(",") if args.compile_modes else None
        if modes and any(m not in bench_compile.MODES for m in modes):
            ap.refuse("--compile-modes", args.compile_modes, f"allowed: {', '.join(bench_compile.MODES)}")
        bench_compile.main(args.device, args.compile_settings.split(","), args.rounds or 10, args.warmup, modes)
        return None
    args.rounds = args.rounds or 20
    device = torch.device(args.device)
    if args.authors is not None:
        return authors_main(args, ap, device)
    if args.setting == "cifar":
        return cifar_main(args, ap, device)
    if args.setting == "draws":
        return draws_main(args, device)
    if args.setting in ("resnet", "shakespeare", "agnews"):  # today's PFL models (fedrun.bench.settings)
        from . import settings

        settings.main(args.setting, device, args.tiny, args.rounds, args.loop_rounds, args.warmup, args.tau)
        return None
    args.tau = args.tau or 20
    args.algos = args.algos or "fedavg,perfedavg-fo,perfedavg-hf,perfedavg-exact"
    if _unknown(args.algos, ALGOS):
        ap.error(f"--algos {','.join(_unknown(args.algos, ALGOS))}: neither a bench setting ({', '.join(ALGOS)}) "
                 f"nor a conf/algo entry ({', '.join(names())})")
    data = synthetic(cache_dir=".cache/fedrun").to(device)
    print(f"device={device} threads={torch.get_num_threads()} clients={data.num_clients} "
          f"train_rows={int(data.train.sizes.sum())} test_rows={int(data.test.sizes.sum())}; "
          f"10 clients/round, tau={args.tau}, batch 20, MLP 60-20-10, all {data.num_clients} clients evaluated every "
          "round, "
          "personalization on "
          f"{'all training rows' if args.personalize_batch is None else f'{args.personalize_batch}-row minibatches'}")
    _print_header(args)
    for name in args.algos.split(","):
        def timed(eng, rounds, name=name):
            sched = Schedule(rounds=rounds, tau=args.tau, clients_per_round=10, batch_size=20, eval_every=1,
                             personalize_batch=args.personalize_batch, aggregate=AGGREGATE.get(name, "uniform"))
            return time_rounds(bench_algo(name, ALGOS), eng, data, sched, device, args.warmup)

        _print_row(name, _time_engines(args, timed))


def cifar_main(args, ap, device) -> None:
    tau = args.tau or 50
    algos = args.algos or "fedavg"
    if _unknown(algos, CIFAR_ALGOS):
        ap.error(f"--algos {','.join(_unknown(algos, CIFAR_ALGOS))}: neither a cifar bench setting "
                 f"({', '.join(CIFAR_ALGOS)}) nor a conf/algo entry ({', '.join(names())})")
    data = cifar_like(args.clients, args.train_per_client, args.test_per_client).to(device)
    m = min(args.clients_per_round, args.clients)
    print(f"device={device} threads={torch.get_num_threads()} CIFAR-shaped random data: {data.num_clients} devices x "
          f"{args.train_per_client} train / {args.test_per_client} test images 3x32x32, 10 classes (5 per device), "
          f"crop+flip; CNN; {m} devices/round, tau=K={tau}, batch {args.batch}; all devices evaluated every "
          f"{args.eval_every} round(s), personalization on "
          f"{'all training rows' if args.personalize_batch is None else f'{args.personalize_batch}-row minibatches'}")
    _print_header(args)
    for name in algos.split(","):
        def timed(eng, rounds, name=name):
            sched = Schedule(rounds=rounds, tau=tau, clients_per_round=m, batch_size=args.batch,
                             eval_every=args.eval_every, personalize_batch=args.personalize_batch)
            return time_rounds(bench_algo(name, CIFAR_ALGOS), eng, data, sched, device, args.warmup,
                               model_fn=lambda: CNN(data.in_features, data.num_classes))

        _print_row(name, _time_engines(args, timed))


def draws_main(args, device) -> None:
    """Median seconds over --rounds draws (after --warmup) of one round's minibatch rows per sampling=."""
    m, n, tau = args.clients_per_round, args.train_per_client, args.tau or 50

    def split(rows: int) -> ClientSplit:  # one feature per row: a draw reads only the clients' row counts
        return ClientSplit.from_flat(torch.zeros(m * rows, 1), torch.zeros(m * rows, dtype=torch.long),
                                     torch.full((m,), rows, dtype=torch.long))

    data = FederatedData("draws", split(n), split(1), 2).to(device)
    print(f"device={device} threads={torch.get_num_threads()} {m} devices of {n} training rows, all training "
          f"every round; tau={tau} steps of one batch of {args.batch} rows; median of {args.rounds} rounds "
          f"after {args.warmup}")
    print(f"{'sampling':<14}{'ms per round':>14}")
    for sampling in SAMPLING:
        sched = Schedule(rounds=1, tau=tau, clients_per_round=m, batch_size=args.batch, sampling=sampling)
        times = []
        for rnd in range(args.warmup + args.rounds):
            sync(device)
            t0 = time.perf_counter()
            sample_round(data, sched, 1, 0, rnd)
            sync(device)
            times.append(time.perf_counter() - t0)
        print(f"{sampling:<14}{1e3 * statistics.median(times[args.warmup:]):>14.2f}")


def _engine_rounds(args):
    """(engine, timed rounds) pairs; `--loop-rounds 0` times the vmap engine alone."""
    return [("vmap", args.rounds)] + ([("loop", args.loop_rounds)] if args.loop_rounds > 0 else [])


def _time_engines(args, timed) -> dict[str, list[float]]:
    """Each engine's s/round, `--repeats` times, the engines alternating and taking turns to go
    first (vmap, loop, loop, vmap, ...): on a shared machine whose speed drifts, both engines then
    see the same spells of load, and neither always runs first."""
    res: dict[str, list[float]] = {}
    for rep in range(args.repeats):
        order = _engine_rounds(args)
        for eng, rounds in order[::-1] if rep % 2 else order:
            res.setdefault(eng, []).append(timed(eng, rounds))
    return res


def _print_header(args) -> None:
    rep = f" (median of {args.repeats}, engines alternating)" if args.repeats > 1 else ""
    print(f"{'algorithm':<18}{'vmap s/round':>14}{'loop s/round':>14}{'loop/vmap':>11}"
          + (f"{'ratio range':>14}" if args.repeats > 1 and args.loop_rounds > 0 else "") + rep)


def _print_row(name: str, res: dict[str, list[float]]) -> None:
    """The medians of each engine's repeats, their ratio, and (with repeats) the range of the
    ratios of the repeats' pairs."""
    med = {k: statistics.median(v) for k, v in res.items()}
    loop = f"{med['loop']:>14.4f}{med['loop'] / med['vmap']:>11.1f}" if "loop" in med else f"{'-':>14}{'-':>11}"
    spread = ""
    if "loop" in res and len(res["loop"]) > 1:
        ratios = [lp / vm for lp, vm in zip(res["loop"], res["vmap"])]
        spread = f"{f'{min(ratios):.1f}-{max(ratios):.1f}':>14}"
    print(f"{name:<18}{med['vmap']:>14.4f}{loop}{spread}", flush=True)


# pFedMe's Table 1 synthetic DNN row as the authors' README runs it (their main.py's options), every
# client training every round (their code's choice; fedrun's `protocol=official`).
AUTHORS_ARGS = ["--dataset", "Synthetic", "--model", "dnn", "--batch_size", "20", "--learning_rate", "0.01",
                "--personal_learning_rate", "0.01", "--beta", "2", "--lamda", "30", "--local_epochs", "20",
                "--algorithm", "pFedMe", "--numusers", "10", "--K", "5", "--times", "1", "--gpu", "-1"]
AUTHORS_TARGET = 40  # issue 11: fedrun at least this many times faster per round
ROUND_MARK = "Round number"


def authors_data(path: Path) -> None:
    """Their Synthetic data (data/Synthetic/data/{train,test}/*.json), made by their generator if missing."""
    folder = path / "data" / "Synthetic"
    if list((folder / "data" / "train").glob("*.json")) and list((folder / "data" / "test").glob("*.json")):
        return
    for sub in ("train", "test"):
        (folder / "data" / sub).mkdir(parents=True, exist_ok=True)
    print(f"generating the authors' Synthetic data in {folder} (their generate_synthetic_05_05.py; minutes)",
          flush=True)
    subprocess.run([sys.executable, "generate_synthetic_05_05.py"], cwd=folder, check=True, stdout=subprocess.DEVNULL)


def _cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) of process `pid` so far, from /proc (None where there is none)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def time_authors(path: Path, warmup: int, rounds: int, threads: int) -> tuple[float, float | None]:
    """Wall and CPU seconds per round of their pFedMe: between the round banners their main.py
    prints (each round evaluates, trains every client and aggregates), from banner `warmup` to
    banner `warmup + rounds`. Their process is stopped then, before it writes results into their tree."""
    cmd = [sys.executable, "-u", "main.py", *AUTHORS_ARGS, "--num_global_iters", str(warmup + rounds + 1)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    marks: list[tuple[float, float | None]] = []
    proc = subprocess.Popen(cmd, cwd=path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    try:
        for line in proc.stdout:
            if ROUND_MARK in line:
                marks.append((time.perf_counter(), _cpu_seconds(proc.pid)))
                if len(marks) == warmup + rounds + 1:
                    break
            tail = (tail + [line])[-20:]
    finally:
        proc.kill()
        proc.wait()
    if len(marks) < warmup + rounds + 1:
        raise RuntimeError(f"the authors' main.py stopped after {len(marks)} rounds:\n{''.join(tail)}")
    (w0, c0), (w1, c1) = marks[warmup], marks[-1]
    return (w1 - w0) / rounds, None if c0 is None or c1 is None else (c1 - c0) / rounds


def time_pfedme(data, rounds: int, warmup: int, device) -> tuple[float, float]:
    """Wall and CPU (this process) seconds per round of fedrun's pFedMe DNN, vmap engine."""
    sched = Schedule(rounds=rounds, tau=20, clients_per_round=10, batch_size=20, eval_every=1,
                     aggregate=AGGREGATE["pfedme"])
    return time_rounds(bench_algo("pfedme", ALGOS), "vmap", data, sched, device, warmup, cpu=True)


def authors_main(args, ap, device) -> None:
    path = Path(args.authors)
    if not (path / "main.py").is_file() or not (path / "FLAlgorithms").is_dir():
        ap.error(f"--authors {args.authors}: not a work tree of CharlieDinh/pFedMe (no main.py and FLAlgorithms/ "
                 "there)")
    if device.type != "cpu":
        ap.error(f"--authors compares on the CPU (their code runs with --gpu -1); got --device {device}")
    authors_data(path)
    threads = torch.get_num_threads()
    data = synthetic(cache_dir=".cache/fedrun")
    print(f"pFedMe DNN 60-20-10, pFedMe Table 1 synthetic setting (official protocol): {data.num_clients} clients all "
          f"training every round, R=20 local rounds of K=5 steps, batch 20, 10 aggregated, every client evaluated "
          f"every round; CPU, {threads} thread(s) each; seconds per round, wall (CPU time of the process)")
    ours = [time_pfedme(data, args.rounds, args.warmup, device)]
    print(f"fedrun (vmap)        {ours[0][0]:.4f} ({ours[0][1]:.4f})", flush=True)
    theirs = time_authors(path, args.warmup, args.authors_rounds, threads)
    cpu = "n/a" if theirs[1] is None else f"{theirs[1]:.4f}"
    print(f"authors' code        {theirs[0]:.4f} ({cpu})  [{args.authors_rounds} rounds after {args.warmup} warm-up]",
          flush=True)
    ours.append(time_pfedme(data, args.rounds, args.warmup, device))
    print(f"fedrun (vmap) again  {ours[1][0]:.4f} ({ours[1][1]:.4f})", flush=True)
    wall = theirs[0] / (sum(o[0] for o in ours) / 2)
    line = f"authors/fedrun       {wall:.1f}x per round, wall"
    if theirs[1] is not None:
        line += f" ({theirs[1] / (sum(o[1] for o in ours) / 2):.1f}x CPU time)"
    print(f"{line}; target >= {AUTHORS_TARGET}x (wall): {'met' if wall >= AUTHORS_TARGET else 'not met'}")


if __name__ == "__main__":
    main()

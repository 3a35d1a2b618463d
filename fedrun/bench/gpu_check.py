"""`fedrun-bench --gpu-check`: every number the first session with a GPU needs, in one table.

On a CUDA machine, in a few minutes and with torch, hydra-core and omegaconf alone (no pytest):
  agreement   the vmap engine with every device branch (fedrun.branches) against the loop engine,
              every model x algorithm of fedrun.bench.agreement, in float64 and in float32 (TF32 off)
  default     the default run's setting (fedrun.bench.cli: synthetic, 100 clients, MLP 60-20-10, tau=20,
              every client evaluated every round) for FedAvg and Per-FedAvg fo/hf/exact, both engines
  cifar_acid  the preset experiment=cifar10_acid5_pfldyn_proto (CNN, tau=K=50, batch 50) through
              fedrun's CIFAR loader, on random images written in CIFAR-10's file format when
              FEDRUN_DATA holds no cifar-10-batches-py
  bench       fedrun-bench --setting cifar (CIFAR-shaped data, CNN, FedAvg), both engines
  seeds       5 seeds trained as one computation (hydra/launcher=batched) against 5 runs of one seed,
              the default Per-FedAvg run
  lr_graphs   compile=graphs in rounds whose lr changes (fedrun.algorithms.rates): the CIFAR ACID preset
              (PFLDyn, lr_decay 0.997) and FedAvg under optim schedules (Adam cosine, SGD momentum
              cosine), eager against graphs: s/round, captures (target 1), max |diff|
              after 2 rounds (target 0); and a probe of CUDA's addcmul against SGD's fused update
  memory      (only when --gpu-check-parts names it) the CIFAR ACID preset and ResNet-18 on CIFAR-100
              all at once, with memory=auto, and capped at 24 GB and 8 GB (fedrun.bench.fitted)
Columns: s/round (vmap engine; loop engine where timed), peak device memory, the agreement's largest
|vmap - loop|, the batched-seeds speedup. Exit status 1 when an agreement check fails.
A machine without CUDA is refused (exit 2); `--gpu-check-device cpu` (hidden) runs the same path on
tiny sizes on the CPU, for the test suite.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

# Sizes of each part: on the GPU the settings named above; "tiny" for the CPU path of the tests.
FULL = dict(compile_rounds=10, rounds=3, warmup=1, clients=100, tau=20, cifar_tau=50, cifar_batch=50, cifar_train=500,
            cifar_test=100,
            per_class=(5000, 1000), seeds=5, agreement_cases=None, preset_clients=100, bench_clients=100,
            algos=("fedavg", "perfedavg-fo", "perfedavg-hf", "perfedavg-exact"),
            tiny=False, c100_per_class=(500, 100), c100_clients=100, resnet_tau=10)
TINY = dict(compile_rounds=1, rounds=1, warmup=1, clients=6, tau=2, cifar_tau=2, cifar_batch=4, cifar_train=6,
            cifar_test=2,
            per_class=(10, 5), seeds=2, agreement_cases=1, preset_clients=10, bench_clients=2, algos=("perfedavg-hf",),
            tiny=True, c100_per_class=(2, 1), c100_clients=4, resnet_tau=1)


@dataclass
class Row:
    part: str
    what: str
    vmap: float | None = None  # s/round
    loop: float | None = None
    memory: float | None = None  # peak device MB
    error: float | None = None  # agreement: largest |vmap - loop|
    speedup: float | None = None  # seeds: (n runs of one seed) / (n seeds batched)
    note: str = ""
    failed: bool = False


def refuse_without_cuda(device: str) -> None:
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        print("fedrun-bench --gpu-check: no CUDA device is available (torch.cuda.is_available() is False); "
              "run it on a machine with an NVIDIA GPU", file=sys.stderr)
        raise SystemExit(2)


def _peak_start(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak_mb(device) -> float | None:
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return None


def agreement_rows(device: str, sizes: dict) -> list[Row]:
    from . import agreement

    rows = []
    cases = agreement.cases(device)
    if sizes["agreement_cases"]:  # tiny: a few cases per model, among them the forced (non-default) paths
        # (not of the models the CPU test suite leaves out, agreement.SUITE_SKIPS)
        cases = [c for m in agreement.MODELS if m not in agreement.SUITE_SKIPS
                 for c in [c for c in cases if c.model == m and c.paths][: sizes["agreement_cases"]]]
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        for dtype in (torch.float64, torch.float32):
            t0 = time.perf_counter()
            worst, failed = 0.0, []
            for case in cases:
                try:
                    res = agreement.run_case(case, device, dtype)
                except Exception as e:  # one broken case must not hide the others' numbers
                    failed.append(f"{case.id} raised {type(e).__name__}: {e}")
                    continue
                worst = max(worst, res["max_err"])
                if not res["ok"]:
                    failed.append(f"{case.id}: {res['worst']} off by {res['ratio']:.3g} tolerances")
            name = str(dtype).removeprefix("torch.")
            note = f"{len(cases) - len(failed)}/{len(cases)} within tolerance, {time.perf_counter() - t0:.0f} s"
            rows.append(Row("agreement", name, error=worst, note=note))
            for f in failed:
                print(f"AGREEMENT FAILED ({name}): {f}", flush=True)
            rows[-1].failed = bool(failed)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    return rows


def _timed(algo, data, sched, device, model_fn, engine: str, warmup: int) -> tuple[float, float | None]:
    from .common import time_rounds

    _peak_start(device)
    s = time_rounds(algo, engine, data, sched, torch.device(device), warmup, model_fn=model_fn)
    return s, _peak_mb(device)


def default_rows(device: str, sizes: dict) -> list[Row]:
    from ..data import synthetic
    from ..models import MLP
    from ..simulate import Schedule
    from .common import ALGOS, bench_algo

    data = synthetic(num_clients=sizes["clients"], cache_dir=None).to(device)
    rows = []
    for name in sizes["algos"]:
        sched = Schedule(rounds=sizes["rounds"], tau=sizes["tau"], clients_per_round=min(10, data.num_clients),
                         batch_size=20)
        model_fn = lambda: MLP(data.in_features, data.num_classes, hidden=[20])
        vm, mem = _timed(bench_algo(name, ALGOS), data, sched, device, model_fn, "vmap", sizes["warmup"])
        lp, _ = _timed(bench_algo(name, ALGOS), data, sched, device, model_fn, "loop", sizes["warmup"])
        rows.append(Row("default", name, vm, lp, mem))
    return rows


def cifar_preset_rows(device: str, sizes: dict, tmp: str) -> list[Row]:
    from hydra import compose, initialize_config_dir

    from ..config import CONF_DIR, instantiate_checked, instantiate_model
    from ..run.protocol import apply_protocol
    from ..run.spec import schedule
    from .common import write_cifar10

    root = os.environ.get("FEDRUN_DATA", "data")
    note = "real CIFAR-10"
    if not os.path.isdir(os.path.join(root, "cifar-10-batches-py")) or sizes is TINY:
        root = os.path.join(tmp, "cifar")
        write_cifar10(root, *sizes["per_class"])
        note = "generated CIFAR-10 files"
    overrides = ["experiment=cifar10_acid5_pfldyn_proto", f"device={device}", f"data.root={root}",
                 "data.download=false",
                 f"cache_dir={os.path.join(tmp, 'cache')}", f"data.num_clients={sizes['preset_clients']}",
                 f"tau={sizes['cifar_tau']}", f"batch_size={sizes['cifar_batch']}"]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    apply_protocol(cfg)
    data = instantiate_checked(cfg.data).to(torch.device(device))
    algo = instantiate_checked(cfg.algo)
    sched = schedule(cfg, data.num_clients)
    sched.rounds = sizes["rounds"]
    model_fn = lambda: instantiate_model(cfg.model, data)
    vm, mem = _timed(algo, data, sched, device, model_fn, cfg.engine, sizes["warmup"])
    return [Row("cifar_acid", "pfldyn proto", vm, None, mem, note=note)]


def bench_rows(device: str, sizes: dict) -> list[Row]:
    from ..models import CNN
    from ..simulate import Schedule
    from .common import CIFAR_ALGOS, bench_algo, cifar_like

    data = cifar_like(sizes["bench_clients"], sizes["cifar_train"], sizes["cifar_test"]).to(device)
    sched = Schedule(rounds=sizes["rounds"], tau=sizes["cifar_tau"], clients_per_round=min(10, data.num_clients),
                     batch_size=sizes["cifar_batch"])
    model_fn = lambda: CNN(data.in_features, data.num_classes)
    vm, mem = _timed(bench_algo("fedavg", CIFAR_ALGOS), data, sched, device, model_fn, "vmap", sizes["warmup"])
    lp, _ = _timed(bench_algo("fedavg", CIFAR_ALGOS), data, sched, device, model_fn, "loop", sizes["warmup"])
    return [Row("bench", "cifar fedavg", vm, lp, mem)]


def seeds_rows(device: str, sizes: dict) -> list[Row]:
    from .seeds import SETTINGS, _setup, time_seeds

    overrides = [*SETTINGS["perfedavg"]] + ([] if sizes is FULL else [f"data.num_clients={sizes['clients']}", "tau=2",
                                                                         "clients_per_round=2"])
    cfg, algo, data, sched = _setup(overrides, device)
    n = sizes["seeds"]
    one = time_seeds(cfg, algo, data, sched, 1, sizes["rounds"])[0]
    _peak_start(device)
    many = time_seeds(cfg, algo, data, sched, n, sizes["rounds"])[0]
    return [Row("seeds", f"perfedavg x{n}", many, None, _peak_mb(device), speedup=n * one / many,
                note=f"1 seed {one:.4f} s/round")]


def compile_rows(device: str, sizes: dict) -> list[Row]:
    """fedrun.bench.compile's table (eager / compiled / graphs / bf16 s/round, busy fraction, each
    mode's max |diff| to eager), printed as it goes; summarized here as one row per setting."""
    from . import compile as bench_compile

    cuda = torch.device(device).type == "cuda"
    settings = [*bench_compile.SETTINGS, "resnet18-c100"] if cuda else ["default-fo"]
    modes = None if cuda else ["eager", "compiled"]
    res = bench_compile.main(device, settings, sizes["compile_rounds"], sizes["warmup"] + 1, modes,
                             small=not cuda, backend="inductor" if cuda else "aot_eager")
    rows = []
    for name in dict.fromkeys(r["setting"] for r in res):
        mine = {r["mode"]: r for r in res if r["setting"] == name}
        eager = mine.get("eager", {}).get("s_round")
        best = min((r for r in mine.values() if r.get("s_round") and r["mode"] != "eager"),
                   key=lambda r: r["s_round"], default=None)
        # compiled and graphs must give eager's numbers (bf16 has its own rounding: reported, not judged)
        bad = [m for m in ("compiled", "graphs") if m in mine and
               (mine[m].get("error") or (mine[m].get("diff") or 0) > COMPILE_TOL)]
        note = (f"fastest {best['mode']} {best['s_round']:.4f} s/round ({eager / best['s_round']:.1f}x eager)"
                if best and eager else "")
        if bad:
            note += f"; DIFFERS FROM EAGER: {', '.join(bad)}"
        rows.append(Row("compile", name, eager, None, mine.get("eager", {}).get("peak_mb"),
                        error=max((r.get("diff") or 0 for m, r in mine.items() if m in ("compiled", "graphs")),
                                  default=None), note=note))
        rows[-1].failed = bool(bad)
    if cuda:  # every algorithm's steps as a CUDA graph against eager
        every = bench_compile.graphs_every_algorithm(device)
        captured = [r for r in every if r.get("captured")]
        wrong = [r["algo"] for r in every if "error" in r or r["diff"] > COMPILE_TOL]
        rows.append(Row("compile", "graphs, every algo", error=max((r.get("diff", 0) for r in every), default=None),
                        note=f"{len(captured)}/{len(every)} captured, the rest eager (reasons above)"
                             + (f"; DIFFERS FROM EAGER or failed: {', '.join(wrong)}" if wrong else "")))
        rows[-1].failed = bool(wrong)
    return rows


# compiled and graph-replayed rounds against eager: max |server params difference| after 2 rounds,
# float32 (reassociated sums in fused kernels; TF32 stays off unless precision=tf32)
COMPILE_TOL = 1e-4


# issue 48 item 1: the CIFAR ACID preset's training round under compile=graphs (s/round, H100/H200)
LR_GRAPHS_TARGET = 0.15
LR_GRAPHS_CASES = {  # label -> (fedrun.bench.compile setting, optim.* of its algorithm)
    "acid pfldyn decay": ("cifar-acid", None),
    "fedavg adam cos": ("default-fedavg", dict(name="adam", schedule="cosine", t_max=1000)),
    "fedavg sgd cos": ("default-fedavg", dict(momentum=0.9, schedule="cosine", t_max=1000)),  # (rates.rate_step)
}


def rate_probe(device: str, n: int = 1 << 20) -> dict[str, int]:
    """Elements of n where torch.optim's SGD update p.add(g, alpha=-lr) on `device` differs from: the
    update rates.rate_step gives a rate tensor, addcmul(p, -rate, g) ("addcmul": 0 lets SGD's scheduled
    rounds replay a graph, rates.fused_addcmul); two roundings, p - rate * g ("two"); one rounding,
    float64's p - lr * g rounded to float32 ("fused": the exact fused multiply-add but for float64's rare
    double roundings). "fused" ~0 with "two" > 0 says p.add is fused there."""
    gen = torch.Generator().manual_seed(0)
    p, g = (torch.randn(n, generator=gen).to(device) for _ in range(2))
    lr = 0.1 * 0.997 ** 41
    rate = torch.tensor(lr, dtype=torch.float64, device=device).to(torch.float32)
    ref = p.add(g, alpha=-lr)
    other = {"addcmul": torch.addcmul(p, -rate, g), "two": p - rate * g,
             "fused": (p.double() - rate.double() * g.double()).float()}
    return {k: int((ref != v).sum()) for k, v in other.items()}


def lr_graph_rows(device: str, sizes: dict, tmp: str) -> list[Row]:
    """compile=graphs against eager in rounds whose rates change (module docstring, lr_graphs); on the
    CPU (the tests' path) one case, eager only: graphs need CUDA."""
    from ..algorithms import rates
    from ..algorithms.base import RunInfo
    from ..algorithms.optim import LocalOptim
    from . import compile as bench_compile

    cuda = torch.device(device).type == "cuda"
    modes = ["eager", "graphs"] if cuda else ["eager"]
    print(bench_compile.HEADER, flush=True)
    rows = []
    for label, (name, optim) in LR_GRAPHS_CASES.items() if cuda else [("fedavg adam cos", LR_GRAPHS_CASES[
            "fedavg adam cos"])]:
        s = bench_compile.setting(name, device, tmp, small=not cuda)
        if optim:
            s.algo = s.algo.bind(RunInfo(optim=LocalOptim(**optim)))
        res = {r["mode"]: r for r in bench_compile.measure(s, modes, sizes["compile_rounds"], sizes["warmup"] + 1)}
        eager, graphs = res["eager"], res.get("graphs")
        if graphs is None:
            rows.append(Row("lr_graphs", label, eager.get("s_round"), note=eager.get("error") or "eager only: "
                            "compile=graphs needs CUDA"))
            rows[-1].failed = "error" in eager
            continue
        replayed = graphs.get("captures") == 1 and not graphs.get("fallback")
        note = (graphs.get("error") or
                (f"eager {eager['s_round']:.4f} s/round; {graphs['captures']} capture(s)"
                 + (f", fell back: {graphs['fallback'][:80]}" if graphs.get("fallback") else "")
                 + (f"; target <= {LR_GRAPHS_TARGET} s/round" if name == "cifar-acid" else "")))
        rows.append(Row("lr_graphs", label, graphs.get("s_round"), memory=graphs.get("peak_mb"),
                        error=graphs.get("drift"), note=note,
                        speedup=eager["s_round"] / graphs["s_round"] if graphs.get("s_round") else None))
        # replayed (SGD's: where the probe's addcmul is 0) and exact after 2 rounds
        sgd_eager = label == "fedavg sgd cos" and not rates.fused_addcmul(torch.device(device), torch.float32)
        rows[-1].failed = bool(graphs.get("error") or (graphs.get("drift") or 0) != 0 or graphs.get("diff")
                               or (not replayed and not sgd_eager))
    bad = rate_probe(device)
    rows.append(Row("lr_graphs", "sgd rate probe", note=f"of {1 << 20} elements, p.add(g, alpha=-lr) differs from "
                    f"addcmul(p, -rate, g) in {bad['addcmul']}, p - rate * g in {bad['two']}, float64's one "
                    f"rounding in {bad['fused']}"))
    return rows


# parts that run only when --gpu-check-parts names them
OPT_IN = ("memory",)


def memory_rows(device: str, sizes: dict, tmp: str) -> list[Row]:
    from .fitted import memory_rows as rows

    return rows(device, sizes, tmp, Row)


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def main(device: str = "cuda", parts: str | None = None) -> int:
    refuse_without_cuda(device)
    sizes = FULL if torch.device(device).type == "cuda" else TINY
    name = torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "cpu"
    print(f"fedrun-bench --gpu-check on {device} ({name}), torch {torch.__version__}", flush=True)
    rows: list[Row] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedrun-gpu-check-") as tmp:
        every = {"agreement": agreement_rows, "default": default_rows,
                 "cifar_acid": lambda d, s: cifar_preset_rows(d, s, tmp), "bench": bench_rows, "seeds": seeds_rows,
                 "compile": compile_rows, "lr_graphs": lambda d, s: lr_graph_rows(d, s, tmp),
                 "memory": lambda d, s: memory_rows(d, s, tmp)}
        # (memory: runs fitted to 8/24 GB caps, fedrun.bench.fitted; only when named, ~3 minutes on an H200)
        chosen = parts.split(",") if parts else [p for p in every if p not in OPT_IN]
        unknown = [p for p in chosen if p not in every]
        if unknown:
            print(f"fedrun-bench --gpu-check-parts: unknown {', '.join(unknown)}; choose from {', '.join(every)}",
                  file=sys.stderr)
            return 2
        for label in chosen:
            part = every[label]
            try:
                rows += part(device, sizes)
            except Exception as e:  # report the part that broke, go on with the others
                rows.append(Row(label, "ERROR",
                                note=f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"))
                rows[-1].failed = True
    print(f"{'part':<11}{'setting':<18}{'vmap s/round':>13}{'loop s/round':>13}{'peak MB':>10}{'max |err|':>11}"
          f"{'speedup':>9}  note")
    for r in rows:
        print(f"{r.part:<11}{r.what:<18}{_fmt(r.vmap, '.4f'):>13}{_fmt(r.loop, '.4f'):>13}{_fmt(r.memory, '.0f'):>10}"
              f"{_fmt(r.error, '.2e'):>11}{_fmt(r.speedup, '.2f'):>9}  {r.note}")
    print(f"total {time.perf_counter() - t0:.0f} s", flush=True)
    return 1 if any(getattr(r, "failed", False) for r in rows) else 0

"""Seconds per training round under each `compile=` / `precision=` (fedrun.run.acceleration), and
whether the faster ways give eager's numbers.

    fedrun-bench --compile [--device cpu|cuda] [--rounds 10] [--compile-settings default-fedavg,pfedme,...]

A "training round" is what fedrun.simulate does each round minus evaluation: draw the round's
clients and minibatch rows, gather the clients' starting state, `tau` local steps, the server step
(the divergence guard's one read included). Timed after warm-up rounds; the first round of a
compiled mode (its compile, or its graph capture) is reported apart as "first round". Each mode
starts from the same model and seed, and its server parameters are compared with eager's: after a
round of 2 local steps ("max|diff|": float rounding for compiled and graphs, bf16's own error for
bf16), and after 2 whole rounds ("2-rd drift": how those differences grow over tau steps).
On CUDA the GPU's busy fraction is the time some kernel runs (the union of kernel intervals,
torch.profiler over the timed rounds again) over the unprofiled wall time.

Settings:
  default-fedavg   the default run's shape (synthetic, 100 clients, MLP 60-20-10, 10 per round,
                   tau=20, batch 20), FedAvg
  default-fo       the same, Per-FedAvg first-order (two batches per step)
  pfedme           pFedMe Table 1's synthetic DNN (experiment=pfedme_synthetic_dnn_pfedme,
                   protocol=official: all 100 clients train, tau=20 x K=5 inner steps)
  cifar-acid       experiment=cifar10_acid5_pfldyn_proto (paper 004's CNN, 100 devices, 10 per
                   round, tau=50 steps of batch 50, crop+flip) on CIFAR-10-shaped data
  seeds5           default-fo with 5 seeds trained as one computation (hydra/launcher=batched)
  resnet18-c100    not measured: fedrun has no ResNet yet (issue 35)
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass

import torch

from ..engine.tree import tree_map
from .common import sync

MODES = {  # name -> (compile, precision)
    "eager": ("none", "fp32"),
    "compiled": ("default", "fp32"),
    "graphs": ("graphs", "fp32"),
    "bf16": ("none", "bf16"),
    "graphs+bf16": ("graphs", "bf16"),
}
SETTINGS = ("default-fedavg", "default-fo", "pfedme", "cifar-acid", "seeds5")


@dataclass
class Setting:
    name: str
    algo: object
    data: object
    sched: object
    model_fn: object
    seeds: int = 1
    engine: object = None  # made once: compile=graphs keeps one graph per (engine, data, shapes)


def _compose(overrides: list[str], device: str):
    from hydra import compose, initialize_config_dir

    from ..config import CONF_DIR, instantiate_checked, instantiate_model
    from ..run.protocol import apply_protocol
    from ..run.spec import schedule

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[*overrides, f"device={device}"])
    apply_protocol(cfg)
    data = instantiate_checked(cfg.data).to(torch.device(device))
    model_fn = lambda: instantiate_model(cfg.model, data)
    return instantiate_checked(cfg.algo), data, schedule(cfg, data.num_clients), model_fn


def setting(name: str, device: str, tmp: str, small: bool = False) -> Setting:
    """The setting `name` (module docstring); `small`: a few clients and steps (the test suite)."""
    from ..data import synthetic
    from ..models import MLP
    from ..simulate import Schedule
    from .common import ALGOS, bench_algo

    if name in ("default-fedavg", "default-fo", "seeds5"):
        data = synthetic(num_clients=6 if small else 100, cache_dir=None).to(device)
        sched = Schedule(rounds=1, tau=2 if small else 20, clients_per_round=3 if small else 10, batch_size=20)
        algo = bench_algo("fedavg" if name == "default-fedavg" else "perfedavg-fo", ALGOS)
        return Setting(name, algo, data, sched, lambda: MLP(data.in_features, data.num_classes, hidden=[20]),
                       5 if name == "seeds5" else 1)
    if name == "pfedme":
        extra = ["data.num_clients=6", "clients_per_round=3", "tau=2", "algo.K=1"] if small else []
        algo, data, sched, model_fn = _compose(["experiment=pfedme_synthetic_dnn_pfedme", "protocol=official", *extra],
                                              device)
        return Setting(name, algo, data, sched, model_fn)
    if name == "cifar-acid":
        from .common import write_cifar10

        root = os.environ.get("FEDRUN_DATA", "data")
        if small or not os.path.isdir(os.path.join(root, "cifar-10-batches-py")):
            root = os.path.join(tmp, "cifar")
            write_cifar10(root, *((10, 5) if small else (5000, 1000)))
        extra = ["data.num_clients=10", "tau=2", "batch_size=4", "clients_per_round=2"] if small else []
        algo, data, sched, model_fn = _compose(["experiment=cifar10_acid5_pfldyn_proto", f"data.root={root}",
                                                "data.download=false", f"cache_dir={os.path.join(tmp, 'cache')}",
                                                *extra], device)
        return Setting(name, algo, data, sched, model_fn)
    raise ValueError(f"unknown setting {name!r}; choose from {', '.join(SETTINGS)}")


def train_rounds(s: Setting, steps, rounds: int, first: int = 1):
    """Rounds `first`..`first + rounds - 1` of training (no evaluation) of `s.seeds` replicas trained
    together, as fedrun.simulate.simulate_group does; returns (seconds, final server states)."""
    from ..engine import ENGINES, params_of
    from ..simulate import _nonfinite_clients, cat_clients, round_draws

    device = s.data.train.x.device
    states = []
    for seed in range(s.seeds):
        torch.manual_seed(seed)
        model = s.model_fn().to(device)
        states.append(s.algo.init(params_of(model), s.data.num_clients))
    if s.engine is None:
        s.engine = ENGINES["vmap"](model)
    engine = s.engine
    sync(device)
    t0 = time.perf_counter()
    for rnd in range(first, first + rounds):
        draws = [round_draws(s.algo, s.data, s.sched, seed, rnd) for seed in range(s.seeds)]
        locals_ = [s.algo.client_init(st, d[1], rnd) for st, d in zip(states, draws)]
        local, idx, aug = (cat_clients(parts) for parts in (locals_, [d[2] for d in draws], [d[3] for d in draws]))
        local = steps(s.algo, engine, local, s.data, idx, rnd, aug)
        _nonfinite_clients(local)
        off = 0
        for i, (clients, trained, _, _) in enumerate(draws):
            mine = local if s.seeds == 1 else tree_map(lambda v: v[off: off + len(trained)], local)
            off += len(trained)
            states[i] = s.algo.server_update(states[i], mine, trained, torch.searchsorted(trained, clients), None)
    sync(device)
    return time.perf_counter() - t0, states


def _short_round(s: Setting, steps) -> list:
    """The server states after round 1 with at most 2 local steps."""
    from ..simulate import Schedule

    full = s.sched
    s.sched = Schedule(**{**full.__dict__, "tau": min(full.tau, 2)})
    try:
        return train_rounds(s, steps, 1, first=1)[1]
    finally:
        s.sched = full


def busy_fraction(fn, wall: float) -> float | None:
    """Time some CUDA kernel runs during fn() (the union of kernel intervals, torch.profiler) over
    `wall`, fn's wall time measured without the profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    busy, end = 0.0, float("-inf")
    for a, b in spans:
        if b > end:
            busy += b - max(a, end)
            end = b
    return None if not spans else min(1.0, busy * 1e-6 / wall)


def measure(s: Setting, modes: list[str], rounds: int, warmup: int, backend: str = "inductor") -> list[dict]:
    """One dict per mode: s/round, first round's seconds, busy fraction, max |diff| to eager."""
    from ..run.acceleration import LocalSteps

    device = s.data.train.x.device
    out, ref = [], None
    for mode in modes:
        comp, prec = MODES[mode]
        row = {"setting": s.name, "mode": mode}
        try:
            steps = LocalSteps(comp, prec, backend=backend)
            first, _ = train_rounds(s, steps, 1)
            train_rounds(s, steps, max(warmup - 1, 0), first=2) if warmup > 1 else None
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            secs, states = train_rounds(s, steps, rounds, first=1 + warmup)
            row.update(s_round=secs / rounds, first=first, fallback=getattr(steps, "_eager_why", None),
                       captures=steps.captures)  # (graphs: over the first, warm-up and timed rounds)
            if device.type == "cuda":
                row["peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
                n = min(rounds, 3)  # the profiler's trace of a few rounds; their unprofiled wall: secs * n / rounds
                row["busy"] = busy_fraction(lambda: train_rounds(s, steps, n, first=1 + warmup), secs * n / rounds)
            # the same start in every mode: the server models after round 1 cut to 2 local steps (the
            # step's own agreement: "diff", judged), and after 2 whole rounds (how float32 rounding
            # differences grow over tau steps: "drift", reported)
            check = (_short_round(s, steps), train_rounds(s, steps, 2, first=1)[1])
            if ref is None and mode == "eager":
                ref = check
            elif ref is not None:
                row["diff"], row["drift"] = (max(float((a.params[k].double() - b.params[k].double()).abs().max())
                                                 for a, b in zip(r, c) for k in a.params) for r, c in zip(ref, check))
        except Exception as e:  # one mode that breaks must not hide the others
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}"
        out.append(row)
        print(format_row(row), flush=True)
    return out


def format_row(r: dict) -> str:
    f = lambda k, spec: "-" if r.get(k) is None else format(r[k], spec)
    note = r.get("error") or (f"fell back to eager: {r['fallback'][:90]}" if r.get("fallback") else "")
    return (f"{r['setting']:<15}{r['mode']:<13}{f('s_round', '.4f'):>10}{f('first', '.2f'):>10}{f('busy', '.0%'):>7}"
            f"{f('peak_mb', '.0f'):>9}{f('diff', '.2e'):>11}{f('drift', '.2e'):>11}  {note}")


HEADER = (f"{'setting':<15}{'mode':<13}{'s/round':>10}{'first s':>10}{'busy':>7}{'peak MB':>9}{'max|diff|':>11}"
          f"{'2-rd drift':>11}  note")


def graphs_every_algorithm(device: str, small: bool = False) -> list[dict]:
    """compile=graphs against eager for every conf/algo entry with its defaults (FedBN: the MLP
    with BatchNorm), 2 rounds of 3 steps on a small synthetic problem (`small`: a tiny one, the
    test suite's): whether its steps were captured (else the reason it runs eagerly) and the
    largest difference of the server models."""
    from ..algorithms import build, names
    from ..data import synthetic
    from ..engine import params_of
    from ..errors import ConfigError
    from ..models import MLP, MLPBN
    from ..run.acceleration import LocalSteps
    from ..simulate import Schedule

    data = (synthetic(num_clients=8, dim=6, num_classes=3, seed=1, cache_dir=None, chunk_len=16) if small
            else synthetic(num_clients=12, cache_dir=None)).to(device)
    hidden = [5] if small else [20]
    rows = []
    for name in names():
        algo = build(name)
        arch = MLP
        try:
            algo.check_params(params_of(MLP(data.in_features, data.num_classes, hidden=hidden)))
        except ConfigError:
            arch = MLPBN
        s = Setting(name, algo, data, Schedule(rounds=1, tau=3, clients_per_round=4, batch_size=10),
                    lambda arch=arch: arch(data.in_features, data.num_classes, hidden=hidden))
        row = {"algo": name}
        try:
            _, ref = train_rounds(s, LocalSteps(), 2)
            steps = LocalSteps("graphs")
            _, out = train_rounds(s, steps, 2)
            row["captured"] = steps.captures > 0 and steps._eager_why is None
            row["why"] = steps._eager_why
            row["diff"] = max(float((a.params[k].double() - b.params[k].double()).abs().max())
                              for a, b in zip(ref, out) for k in a.params)
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}"
        rows.append(row)
        print(f"graphs {name:<11}" + (f"ERROR {row['error']}" if "error" in row else
              f"{'captured' if row['captured'] else 'eager   '} max|diff| {row['diff']:.2e}"
              + (f"  ({row['why'][:100]})" if row["why"] else "")), flush=True)
    return rows


def main(device: str, settings: list[str], rounds: int, warmup: int, modes: list[str] | None = None,
         small: bool = False, backend: str = "inductor") -> list[dict]:
    cuda = torch.device(device).type == "cuda"
    modes = modes or ([m for m in MODES] if cuda else ["eager", "compiled", "bf16"])
    print(f"training rounds (no evaluation) on {device} "
          f"({torch.cuda.get_device_name(device) if cuda else 'cpu'}), torch {torch.__version__}, "
          f"threads={torch.get_num_threads()}, {rounds} timed rounds after {warmup} warm-up (the first apart)")
    print(HEADER)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fedrun-bench-compile-") as tmp:
        for name in settings:
            if name == "resnet18-c100":
                print(f"{name:<15}{'-':<13}  not measured: fedrun has no ResNet model yet (issue 35)")
                continue
            rows += measure(setting(name, device, tmp, small), modes, rounds, warmup, backend)
    return rows

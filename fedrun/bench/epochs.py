"""`fedrun-bench --epochs`: what a round in local epochs costs on uneven clients (issue 44).

Per setting and algorithm it times, on one engine (vmap) and after warm-up rounds:
- **epochs**: a round of `algo.local_epochs=1`, each client floor(n_c / B) steps, computed as fedrun
  runs it (`simulate._epochs_by_work`: the clients sorted by their steps, each step computing only the
  clients still training);
- **masked**: the same round computed the old way (every client stepped for the largest client's
  count, the finished ones masked), the same numbers;
- **steps**: a round of `tau` steps for every client doing the same total number of client steps
  (tau = the epoch round's total / its clients, rounded up).
The ratio epochs / steps is the price of uneven work (target: within 1.5x); masked / epochs what
sorting by work saves. **depth** is each round's sequential steps (vectorized steps one after another: the
epoch round's largest client's steps, the steps round's tau); epochs depth / steps depth is the ratio the two
rounds show when a step costs the same however many clients it computes (its fixed cost dominating: small
models on the CPU): SGD's steps of one client cannot run side by side. **floor** measures that bound: the epoch
round's sequential steps (its depth) run for one client alone, its largest, in the plainest eager torch (the model
as an nn.Module, `F.cross_entropy(...).backward()`, `torch.optim.SGD.step()`, each client's rows gathered before the
clock starts), as PFLlib's client loop runs them: no way of computing the epoch round in eager torch, vectorized or
not, goes much under it without fusing steps (ep/floor near or under 1: the round costs what its longest client's
steps cost). Settings: `synthetic` (the default run's
100 power-law clients) and `mnist` (MNIST, Dirichlet 0.1 over 20 clients, as issue 44's PFLlib comparison;
needs the files under $FEDRUN_DATA or --mnist-root).
"""
from __future__ import annotations

import math
import os
import time

import torch

from ..algorithms.base import RunInfo
from ..simulate import local_training, one_step, round_draws
from .common import sync


def _masked(algo, engine, local, data, idx, rnd, aug=None):
    return local_training(algo, engine, local, data, idx, rnd, aug, step=one_step)


def _setting(name: str, device: str, mnist_root: str | None):
    from ..data import synthetic
    from ..models import MLP
    from ..simulate import Schedule

    if name == "synthetic":
        data = synthetic(num_clients=100, cache_dir=None).to(device)
        return data, Schedule(rounds=1, tau=1, clients_per_round=10, batch_size=20), \
            lambda: MLP(data.in_features, data.num_classes, hidden=[20])
    if name == "mnist":
        from .compile import _compose

        root = mnist_root or os.environ.get("FEDRUN_DATA", "data")
        _, data, sched, model_fn = _compose(["dataset=mnist", f"dataset.root={root}", "dataset.download=false",
                                             "partition=dirichlet", "partition.alpha=0.1", "partition.num_clients=20",
                                             "clients_per_round=20", "batch_size=10", "model=fedavg_cnn",
                                             "cache_dir=null"],
                                            device)
        return data, sched, model_fn
    raise ValueError(f"unknown --epochs setting {name!r}; choose from synthetic, mnist")


def _depth(d) -> int:
    """A phase's sequential steps: its longest client's live steps (all its steps without `live`)."""
    return int(d.live.sum(1).max()) if d.live is not None else d.idx.shape[1]


def _time(algo, data, sched, model_fn, steps_fn, rounds: int, warmup: int,
          device: str) -> tuple[float, int, float, int]:
    """(seconds per round, client steps per round, this process's CPU seconds per round, sequential steps per
    round) of `rounds` timed rounds after `warmup` rounds (CPU seconds: what other processes on a shared
    machine move least)."""
    from ..engine import ENGINES, params_of

    torch.manual_seed(0)
    model = model_fn().to(device)
    engine = ENGINES["vmap"](model)
    algo = algo.bind(RunInfo.of(sched, data, algo.optim, algo.bn))
    state = algo.init(params_of(model), data.num_clients)
    t0, c0, work, depth = None, None, 0, 0
    for rnd in range(1, warmup + rounds + 1):
        if rnd == warmup + 1:
            sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
        clients, trained, idx, aug = round_draws(algo, data, sched, 0, rnd)
        if rnd > warmup:
            work += sum(int(d.live.sum()) if d.live is not None else d.idx.shape[0] * d.idx.shape[1]
                        for d in idx) if isinstance(idx, tuple) else idx.shape[0] * idx.shape[1]
            depth += sum(_depth(d) for d in idx) if isinstance(idx, tuple) else idx.shape[1]
        local = algo.start_local(state, trained, rnd)
        local = steps_fn(algo, engine, local, data, idx, rnd, aug)
        state = algo.end_round(state, local, trained, torch.searchsorted(trained, clients), None, data.num_clients)
    sync(device)
    return (time.perf_counter() - t0) / rounds, work // rounds, (time.process_time() - c0) / rounds, depth // rounds


def _floor(algo, data, sched, model_fn, rounds: int, warmup: int, device: str) -> tuple[float, float, int]:
    """(seconds, CPU seconds, steps) per round of each timed round's depth (`_depth` summed over its phases) in plain
    eager steps of one client, the round's largest (its rows of the first phase's draw, cycled), on an nn.Module
    with torch.optim.SGD: the sequential part of the epoch round, at the cost of the simplest per-client loop."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = model_fn().to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)  # (timing only: the lr moves no cost)
    algo = algo.bind(RunInfo.of(sched, data, algo.optim, algo.bn))
    seconds = cpu = 0.0
    steps = 0
    for rnd in range(1, warmup + rounds + 1):
        _, _, idx, _ = round_draws(algo, data, sched, 0, rnd)
        depth = sum(_depth(d) for d in idx)
        d = idx[0]
        c = int(torch.argmax(d.per_pass))
        x, y = data.train.rows(d.idx[c, : max(int(d.per_pass[c]), 1), 0])  # [steps, B, ...], [steps, B]
        sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        done = 0
        for s in range(depth):
            opt.zero_grad()
            F.cross_entropy(model(x[s % len(x)]), y[s % len(y)]).backward()
            opt.step()
            done += 1
        sync(device)
        if rnd > warmup:
            seconds, cpu = seconds + time.perf_counter() - t0, cpu + time.process_time() - c0
            steps += done
    return seconds / rounds, cpu / rounds, steps // rounds


def main(settings: list[str], algos: list[str], rounds: int, warmup: int, device: str,
         mnist_root: str | None = None) -> list[dict]:
    from dataclasses import replace

    from ..algorithms import build

    rows = []
    print(f"# local epochs on uneven clients ({device}, vmap, {torch.get_num_threads()} threads, "
          f"{rounds} rounds after {warmup})")
    print(f"{'setting':10s} {'algo':9s} {'steps/rnd':>9s} {'epochs s':>9s} {'masked s':>9s} {'steps s':>9s} "
          f"{'ep/steps':>8s} {'masked/ep':>9s} {'ep/steps CPU':>12s} {'depth ep/steps':>14s} {'floor s':>8s} "
          f"{'ep/floor':>8s}")
    for name in settings:
        data, sched, model_fn = _setting(name, device, mnist_root)
        for a in algos:
            epochs = _time(build(a, local_epochs=1), data, sched, model_fn, local_training, rounds, warmup, device)
            masked = _time(build(a, local_epochs=1), data, sched, model_fn, _masked, rounds, warmup, device)
            tau = max(1, math.ceil(epochs[1] / min(sched.clients_per_round, data.num_train_clients)))
            steps = _time(build(a), data, replace(sched, tau=tau), model_fn, local_training, rounds, warmup, device)
            floor = _floor(build(a, local_epochs=1), data, sched, model_fn, rounds, warmup, device)
            row = dict(setting=name, algo=a, work=epochs[1], epochs_s=epochs[0], masked_s=masked[0], steps_s=steps[0],
                       steps_work=steps[1], epochs_cpu_s=epochs[2], masked_cpu_s=masked[2], steps_cpu_s=steps[2],
                       epochs_depth=epochs[3], steps_depth=steps[3], floor_s=floor[0], floor_cpu_s=floor[1],
                       floor_steps=floor[2])
            rows.append(row)
            print(f"{name:10s} {a:9s} {epochs[1]:9d} {epochs[0]:9.3f} {masked[0]:9.3f} {steps[0]:9.3f} "
                  f"{epochs[0] / steps[0]:8.2f} {masked[0] / epochs[0]:9.2f} {epochs[2] / steps[2]:12.2f} "
                  f"{epochs[3] / steps[3]:14.2f} {floor[0]:8.3f} {epochs[0] / floor[0]:8.2f}")
    return rows

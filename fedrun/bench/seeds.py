"""Wall time of seeds batched (`hydra/launcher=batched`) against one seed, per round, after warm-up.

    fedrun-bench --seeds 1,5,10 [--rounds 3] [--settings pfedme,perfedavg]

Settings (composed from conf/ exactly as `fedrun` would, then trained by the round loop that the
batched launcher runs, `fedrun.simulate.simulate_group`, with 1, 5, 10 replicas):
  pfedme     experiment=pfedme_synthetic_dnn_pfedme protocol=official (pFedMe Table 1, DNN: all 100
             clients train every round, R=20 local rounds of K=5 inner steps, 10 aggregated)
  perfedavg  the default `fedrun` run (Per-FedAvg FO, synthetic, DNN 60-20-10, 10 clients per round,
             tau=10, every client evaluated every round with personalization on all training rows)
Targets (issue 11, never asserted): 5 seeds <= 1.6x and 10 seeds <= 2.5x the time of 1 seed.
Columns: wall s/round and its ratio to 1 seed; this process's CPU s/round and ratio (steadier on a
shared CPU); of that CPU time, one round's evaluation of all seeds (per seed, timed after the timed
rounds) and the rest of the round (training and server steps: what batching stacks) with its ratio.
Last, per setting, the line through 1 seed and the most seeds: the wall time each added seed costs
and the part all seeds share (the most batching can save per added seed). A 1.6x target for 5 seeds
needs the shared part to be at least 85% of one seed's round.
"""
from __future__ import annotations

import time

import torch
from hydra import compose, initialize_config_dir

SETTINGS = {
    "pfedme": ["experiment=pfedme_synthetic_dnn_pfedme", "protocol=official"],
    "perfedavg": [],
}


def _setup(overrides: list[str], device: str):
    from ..config import CONF_DIR, instantiate_checked
    from ..run.protocol import apply_protocol
    from ..run.spec import schedule

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[*overrides, f"device={device}"])
    apply_protocol(cfg)
    data = instantiate_checked(cfg.data).to(torch.device(device))
    return cfg, instantiate_checked(cfg.algo), data, schedule(cfg, data.num_clients)


def time_seeds(cfg, algo, data, sched, seeds: int, rounds: int, warmup: int = 1) -> tuple[float, float, float]:
    """Wall and CPU (this process's) seconds per round of `seeds` replicas trained together
    (evaluation every round included; on a CPU shared with other jobs the CPU time is the steadier),
    and the CPU seconds of one round's evaluation of all of them (per seed, as the round loop does)."""
    from ..config import instantiate_model
    from ..engine import ENGINES, params_of
    from ..evaluate import evaluate
    from ..simulate import Replica, Schedule, eval_context, simulate_group

    def replicas():
        out = []
        for s in range(seeds):
            torch.manual_seed(s)
            model = instantiate_model(cfg.model, data)
            out.append(Replica(s, params_of(model.to(data.train.x.device))))
        return out, model

    runs, model = replicas()
    engine = ENGINES[cfg.engine](model, max_chunks=cfg.max_chunks)
    simulate_group(algo, engine, data, runs, Schedule(**{**sched.__dict__, "rounds": warmup}))
    runs, _ = replicas()
    if data.train.x.is_cuda:
        torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.process_time()
    simulate_group(algo, engine, data, runs, Schedule(**{**sched.__dict__, "rounds": rounds}))
    if data.train.x.is_cuda:
        torch.cuda.synchronize()
    wall, cpu = (time.perf_counter() - t0) / rounds, (time.process_time() - c0) / rounds
    c0 = time.process_time()
    for r in runs:
        evaluate(algo, engine, r.at.state, data, eval_context(data, sched, r.seed, rounds))
    if data.train.x.is_cuda:
        torch.cuda.synchronize()
    return wall, cpu, time.process_time() - c0


def main(seeds: list[int], rounds: int, settings: list[str], device: str) -> None:
    print(f"device={device} threads={torch.get_num_threads()}; {rounds} timed rounds after 1 warm-up round, "
          f"evaluation every round; targets: 5 seeds <= 1.6x, 10 seeds <= 2.5x one seed")
    print(f"{'setting':<11}{'seeds':>6}{'s/round':>10}{'x 1 seed':>10}{'cpu s/round':>13}{'x 1 seed':>10}"
          f"{'cpu eval':>10}{'cpu rest':>10}{'x 1 seed':>10}")
    shares = []
    for name in settings:
        cfg, algo, data, sched = _setup(SETTINGS[name], device)
        base = None
        walls = {}
        for n in seeds:
            wall, cpu, ev = time_seeds(cfg, algo, data, sched, n, rounds)
            walls[n] = wall
            t = (wall, cpu, cpu - ev)  # rest: the round's CPU time without its evaluation (training, server steps)
            base = base or (t if n == 1 else None)
            ratios = [f"{v / b:>10.2f}" if base else f"{'':>10}" for v, b in zip(t, base or t)]
            print(f"{name:<11}{n:>6}{wall:>10.3f}{ratios[0]}{cpu:>13.3f}{ratios[1]}"
                  f"{ev:>10.3f}{cpu - ev:>10.3f}{ratios[2]}",
                  flush=True)
        if 1 in walls and max(walls) > 1:
            shares.append((name, *split_fixed(walls)))
    for name, fixed, per_seed, one in shares:
        shared = (f"the part all seeds share {fixed:.3f} s ({fixed / one:.0%}): the most batching can save per added "
                  "seed"
                  if fixed > 0 else "nothing shared: batched, an added seed costs at least as much as a seed alone")
        print(f"{name}: a line through 1 and {max(seeds)} seeds: each added seed {per_seed:.3f} s/round "
              f"({per_seed / one:.0%} of one seed alone); {shared}")


def split_fixed(walls: dict[int, float]) -> tuple[float, float, float]:
    """The line T(n) = fixed + n * per_seed through the times of 1 seed and of the most seeds
    measured: (fixed, per_seed, T(1)). The fixed part is what batching shares (dispatch, Python,
    the latency of small operations); per_seed is the work each seed adds."""
    n = max(walls)
    per_seed = (walls[n] - walls[1]) / (n - 1)
    return walls[1] - per_seed, per_seed, walls[1]

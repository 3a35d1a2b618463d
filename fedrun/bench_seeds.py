"""Wall time of seeds batched (`hydra/launcher=batched`) against one seed, per round, after warm-up.

    fedrun-bench --seeds 1,5,10 [--rounds 3] [--settings pfedme,perfedavg]

Settings (composed from conf/ exactly as `fedrun` would, then trained by the round loop that the
batched launcher runs, `fedrun.simulate.simulate_group`, with 1, 5, 10 replicas):
  pfedme     experiment=pfedme_synthetic_dnn_pfedme protocol=official (pFedMe Table 1, DNN: all 100
             clients train every round, R=20 local rounds of K=5 inner steps, 10 aggregated)
  perfedavg  the default `fedrun` run (Per-FedAvg FO, synthetic, DNN 60-20-10, 10 clients per round,
             tau=10, every client evaluated every round with personalization on all training rows)
Targets (issue 11, never asserted): 5 seeds <= 1.6x and 10 seeds <= 2.5x the time of 1 seed.
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
    from .cli import CONF_DIR, _instantiate, schedule
    from .protocol import apply_protocol

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[*overrides, f"device={device}"])
    apply_protocol(cfg)
    data = _instantiate(cfg.data).to(torch.device(device))
    return cfg, _instantiate(cfg.algo), data, schedule(cfg, data.num_clients)


def time_seeds(cfg, algo, data, sched, seeds: int, rounds: int, warmup: int = 1) -> float:
    """Seconds per round of `seeds` replicas trained together (evaluation every round included)."""
    from .cli import _instantiate
    from .functional import ENGINES, params_of
    from .simulate import Replica, Schedule, simulate_group

    def replicas():
        out = []
        for s in range(seeds):
            torch.manual_seed(s)
            model = _instantiate(cfg.model, in_features=data.in_features, num_classes=data.num_classes)
            out.append(Replica(s, params_of(model.to(data.train.x.device))))
        return out, model

    runs, model = replicas()
    engine = ENGINES[cfg.engine](model, max_chunks=cfg.max_chunks)
    simulate_group(algo, engine, data, runs, Schedule(**{**sched.__dict__, "rounds": warmup}))
    runs, _ = replicas()
    if data.train.x.is_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    simulate_group(algo, engine, data, runs, Schedule(**{**sched.__dict__, "rounds": rounds}))
    if data.train.x.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / rounds


def main(seeds: list[int], rounds: int, settings: list[str], device: str) -> None:
    print(f"device={device} threads={torch.get_num_threads()}; {rounds} timed rounds after 1 warm-up round, "
          f"evaluation every round; targets: 5 seeds <= 1.6x, 10 seeds <= 2.5x one seed")
    print(f"{'setting':<11}{'seeds':>6}{'s/round':>10}{'x 1 seed':>10}{'s/round/seed':>14}")
    for name in settings:
        cfg, algo, data, sched = _setup(SETTINGS[name], device)
        base = None
        for n in seeds:
            t = time_seeds(cfg, algo, data, sched, n, rounds)
            base = base or (t if n == 1 else None)
            ratio = f"{t / base:>10.2f}" if base else f"{'':>10}"
            print(f"{name:<11}{n:>6}{t:>10.3f}{ratio}{t / n:>14.3f}", flush=True)

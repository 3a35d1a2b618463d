"""One experiment: instantiate data, model and algorithm, simulate, write the run's files."""
from __future__ import annotations

import json
import os
import sys
import time

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from . import outputs
from .algorithms.base import ConfigError, ServerState
from .data import FederatedData
from .device import resolve_device
from .functional import ENGINES, params_of
from .protocol import apply_protocol
from .resume import find_resume_point, fingerprint
from .simulate import Diverged, Progress, simulate
from .validation import check_model_fits, instantiate_checked, schedule, validate


def run(cfg: DictConfig, out_dir: str) -> dict:
    """One experiment; writes its files into `out_dir` and returns the summary it writes."""
    t0 = time.time()
    protocol = apply_protocol(cfg)
    problems = validate(cfg)
    if problems:
        raise ConfigError("\n".join(problems))
    device = resolve_device(str(cfg.device))
    algo = instantiate_checked(cfg.algo)
    data: FederatedData = instantiate_checked(cfg.data)
    sched = schedule(cfg, data.num_clients)
    ck = find_resume_point(cfg, out_dir)
    summary_path = os.path.join(out_dir, "summary.json")
    if ck is not None and ck["round"] >= sched.rounds and os.path.exists(summary_path):
        with open(summary_path) as f:
            done = json.load(f)
        if done.get("status") == "finished" and done.get("rounds") == ck["round"] == sched.rounds:
            print(f"fedrun: already finished ({sched.rounds} rounds) in {out_dir}; resume=false starts over")
            return done
    data = data.to(device)
    torch.manual_seed(cfg.seed)
    model = instantiate_checked(cfg.model, in_features=data.in_features, num_classes=data.num_classes)
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    check_model_fits(model, data, choices.get("model", cfg.model._target_), choices.get("data", data.name))
    model = model.to(device)
    engine = ENGINES[cfg.engine](model, max_chunks=cfg.max_chunks)

    os.makedirs(out_dir, exist_ok=True)
    outputs.write_partition(data, os.path.join(out_dir, "partition.csv"))
    metrics_path = os.path.join(out_dir, "metrics.csv")
    history: list[dict] = []
    start = None
    if ck is not None:
        history = list(ck["history"])
        st = ck["state"]
        state = ServerState(
            params={k: v.to(device) for k, v in st["params"].items()},
            extra=_to_device(st["extra"], device),
            clients=_to_device(st.get("clients", {}), device),
        )
        start = Progress(state, ck["round"], ck["transmitted"])
        # metrics.csv becomes exactly the rows the checkpoint saw; later rows (if a kill left any)
        # are recomputed identically.
        if history:
            outputs.write_csv(metrics_path, history)
        elif os.path.exists(metrics_path):
            os.remove(metrics_path)
        print(f"fedrun: resuming from {ck['path']} (round {ck['round']})", file=sys.stderr)
    elif os.path.exists(metrics_path):  # a fresh run owns its metrics; never append to an old run's
        os.replace(metrics_path, metrics_path + ".previous")
    log: outputs.CsvLog | None = None
    fp = fingerprint(cfg)

    def on_eval(rnd: int, transmitted: int, ev) -> None:
        nonlocal log
        row = {"round": rnd, "models_transmitted": transmitted, **ev.row}
        if log is None:
            log = outputs.CsvLog(metrics_path, list(row))
        log.write(row)
        history.append(row)

    def on_checkpoint(at: Progress) -> None:
        outputs.save_checkpoint(os.path.join(out_dir, "checkpoints"), at.round, {
            "config": fp,
            "state": {"params": at.state.params, "extra": at.state.extra, "clients": at.state.clients},
            "transmitted": at.transmitted,
            "history": history,
            "torch_rng": torch.get_rng_state(),
        })

    try:
        _, last = simulate(algo, engine, data, params_of(model), sched, cfg.seed, on_eval=on_eval,
                           progress=cfg.progress, start=start, on_checkpoint=on_checkpoint,
                           checkpoint_every=cfg.checkpoint_every, client_chunk=cfg.client_chunk)
    except Diverged as e:
        summary = {"status": "diverged", "error": str(e), **(_summary(history, time.time() - t0, cfg, device) if history else {})}
        outputs.write_json(summary_path, summary)
        if cfg.on_diverge == "record":
            print(f"fedrun: diverged (recorded, on_diverge=record): {e}", file=sys.stderr)
            return summary
        raise
    finally:
        if log is not None:
            log.close()
    if last is not None:
        outputs.write_clients(data, last, os.path.join(out_dir, "clients.csv"))
    summary = {"status": "finished", **_summary(history, time.time() - t0, cfg, device),
               "protocol": cfg.protocol, "protocol_choices": protocol}
    outputs.write_json(summary_path, summary)
    if cfg.plot:
        from .plots import plot_run

        plot_run(metrics_path, os.path.join(out_dir, "metrics.png"),
                 title=f"{HydraConfig.get().runtime.choices.get('algo', '') if HydraConfig.initialized() else ''}"
                       f" on {data.name}, seed {cfg.seed}")
    return summary


def _to_device(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj


def _summary(history: list[dict], seconds: float, cfg: DictConfig, device) -> dict:
    last = history[-1]
    out = {"rounds": last["round"], "seconds": round(seconds, 2), "device": str(device), "engine": cfg.engine}
    for prefix in ("global", "pers"):
        key = f"{prefix}_acc"
        if key not in last:
            continue
        best = max(history, key=lambda r: r[key])
        out[f"{prefix}_acc_last_round"] = last[key]
        out[f"{prefix}_acc_best_round"] = best[key]
        out[f"{prefix}_best_round"] = best["round"]
        out[f"{prefix}_acc_client_min_last_round"] = last[f"{prefix}_acc_min"]
        out[f"{prefix}_acc_client_max_last_round"] = last[f"{prefix}_acc_max"]
    return out

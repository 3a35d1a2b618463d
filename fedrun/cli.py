"""`fedrun`: compose (Hydra) -> instantiate data, model, algorithm -> simulate -> write outputs."""
from __future__ import annotations

import os
import sys
import time

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from . import outputs
from .algorithms.base import ConfigError, check_choice
from .data import DataMissingError, FederatedData
from .functional import ENGINES, params_of
from .simulate import Diverged, Schedule, simulate

CONF_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")
GROUPS = ("algo", "data", "model")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu" or name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        if name.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"device={name!r} but no CUDA device is available; use device=auto or device=cpu")
        return torch.device(name)
    raise ConfigError(f"device={name!r} is not allowed; choose one of: auto, cpu, cuda, cuda:N")


def _int_option(cfg: DictConfig, key: str, low: int) -> int:
    v = cfg[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise ConfigError(f"{key}={v!r} must be an integer >= {low}")
    return v


def schedule(cfg: DictConfig, num_clients: int) -> Schedule:
    """The run's schedule from the top-level knobs, each checked with a one-line message."""
    m = _int_option(cfg, "clients_per_round", 1)
    if cfg.frac is not None:
        f = cfg.frac
        if not isinstance(f, (int, float)) or isinstance(f, bool) or not 0 < f <= 1:
            raise ConfigError(f"frac={f!r} must be a fraction in (0, 1] (or null to use clients_per_round)")
        m = max(1, round(f * num_clients))
    if m > num_clients:
        raise ConfigError(f"clients_per_round={m} exceeds the {num_clients} clients of the data; allowed: 1..{num_clients}")
    return Schedule(
        rounds=_int_option(cfg, "rounds", 1),
        tau=_int_option(cfg, "tau", 1),
        clients_per_round=m,
        batch_size=_int_option(cfg, "batch_size", 1),
        eval_every=_int_option(cfg, "eval_every", 1),
        personalize_batch=None if cfg.personalize_batch is None else _int_option(cfg, "personalize_batch", 1),
    )


def _instantiate(node: DictConfig, **kwargs):
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as e:
        cause = e.__cause__ or e
        if isinstance(cause, (ConfigError, DataMissingError, ValueError, TypeError)):
            raise ConfigError(str(cause).splitlines()[0]) from cause
        raise


def run(cfg: DictConfig, out_dir: str) -> dict:
    """One experiment; writes its files into `out_dir` and returns the summary it writes."""
    t0 = time.time()
    check_choice("engine", cfg.engine, sorted(ENGINES))
    device = resolve_device(str(cfg.device))
    # Check the cheap options before loading data, then those that need the data's size.
    schedule(cfg, num_clients=10**9)
    algo = _instantiate(cfg.algo)
    data: FederatedData = _instantiate(cfg.data)
    sched = schedule(cfg, data.num_clients)
    data = data.to(device)
    torch.manual_seed(cfg.seed)
    model = _instantiate(cfg.model, in_features=data.in_features, num_classes=data.num_classes).to(device)
    engine = ENGINES[cfg.engine](model, max_chunks=cfg.max_chunks)

    os.makedirs(out_dir, exist_ok=True)
    _write_partition(data, os.path.join(out_dir, "partition.csv"))
    metrics_path = os.path.join(out_dir, "metrics.csv")
    if os.path.exists(metrics_path):  # a fresh run owns its metrics; never append to an old run's
        os.replace(metrics_path, metrics_path + ".previous")
    log: outputs.CsvLog | None = None
    history: list[dict] = []

    def on_eval(rnd: int, transmitted: int, ev) -> None:
        nonlocal log
        row = {"round": rnd, "models_transmitted": transmitted, **ev.row}
        if log is None:
            log = outputs.CsvLog(metrics_path, list(row))
        log.write(row)
        history.append(row)

    try:
        _, last = simulate(algo, engine, data, params_of(model), sched, cfg.seed, on_eval=on_eval, progress=cfg.progress)
    finally:
        if log is not None:
            log.close()
    _write_clients(data, last, os.path.join(out_dir, "clients.csv"))
    summary = _summary(history, time.time() - t0, cfg, device)
    outputs.write_json(os.path.join(out_dir, "summary.json"), summary)
    if cfg.plot:
        from .plots import plot_run

        plot_run(metrics_path, os.path.join(out_dir, "metrics.png"),
                 title=f"{HydraConfig.get().runtime.choices.get('algo', '') if HydraConfig.initialized() else ''}"
                       f" on {data.name}, seed {cfg.seed}")
    return summary


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


def _write_partition(data: FederatedData, path: str) -> None:
    k = data.num_classes
    tr, te = data.train.label_counts(k).cpu(), data.test.label_counts(k).cpu()
    rows = []
    for c in range(data.num_clients):
        row = {"client": c, "n_train": int(tr[c].sum()), "n_test": int(te[c].sum())}
        row.update({f"train_label_{j}": int(tr[c, j]) for j in range(k)})
        row.update({f"test_label_{j}": int(te[c, j]) for j in range(k)})
        rows.append(row)
    outputs.write_csv(path, rows)


def _write_clients(data: FederatedData, ev, path: str) -> None:
    n_tr, n_te = data.train.sizes.cpu(), data.test.sizes.cpu()
    rows = []
    for c in range(data.num_clients):
        row = {"client": c, "n_train": int(n_tr[c]), "n_test": int(n_te[c])}
        row.update({k: float(v[c]) for k, v in ev.per_client.items()})
        rows.append(row)
    outputs.write_csv(path, rows)


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float | None:
    out_dir = HydraConfig.get().runtime.output_dir
    try:
        summary = run(cfg, out_dir)
    except (ConfigError, DataMissingError, Diverged) as e:
        if os.environ.get("FEDRUN_DEBUG"):
            raise
        print(f"fedrun: error: {e}", file=sys.stderr)
        sys.exit(3 if isinstance(e, Diverged) else 2)
    msg = ", ".join(f"{k}={v:.4f}" for k, v in summary.items() if k.endswith(("acc_last_round", "acc_best_round")) and "client" not in k)
    print(f"fedrun: done in {summary['seconds']:.1f}s: {msg}\nfedrun: outputs in {out_dir}")
    return summary.get("pers_acc_last_round", summary.get("global_acc_last_round"))


def precheck(argv: list[str]) -> str | None:
    """One-line message for an unknown config group option or key in `argv`, else None.

    Hydra's own messages for these are several lines long; this catches the common typos first.
    """
    choices = {g: None for g in GROUPS}
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if key in GROUPS:
            allowed = sorted(f[:-5] for f in os.listdir(os.path.join(CONF_DIR, key)) if f.endswith(".yaml"))
            for v in value.split(","):
                if v not in allowed:
                    return f"{key}={v!r} is not a known {key}; choose one of: {', '.join(allowed)}"
            choices[key] = value.split(",")[0]
    top = OmegaConf.load(os.path.join(CONF_DIR, "config.yaml"))
    defaults = {list(d)[0]: list(d.values())[0] for d in top.defaults if not isinstance(d, str)}
    for arg in argv:
        if arg.startswith(("-", "+", "~")) or "=" not in arg:
            continue
        key = arg.split("=", 1)[0]
        head, _, rest = key.partition(".")
        if head == "hydra" or key in GROUPS:
            continue
        if head in GROUPS and rest:
            group_cfg = OmegaConf.load(os.path.join(CONF_DIR, head, f"{choices[head] or defaults[head]}.yaml"))
            if rest.split(".")[0] not in group_cfg:
                known = sorted(k for k in group_cfg if not str(k).startswith("_"))
                return f"{key} is not an option of {head}={choices[head] or defaults[head]}; its options: {', '.join(known)}"
        elif head not in top:
            known = sorted(k for k in top if k not in ("defaults", "hydra"))
            return f"unknown option {key!r}; top-level options: {', '.join(known)}, and groups {', '.join(GROUPS)}"
    return None


def main() -> None:
    problem = precheck(sys.argv[1:])
    if problem:
        print(f"fedrun: error: {problem}", file=sys.stderr)
        sys.exit(2)
    _hydra_main()


if __name__ == "__main__":
    main()

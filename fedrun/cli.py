"""`fedrun`: compose (Hydra) -> instantiate data, model, algorithm -> simulate -> write outputs."""
from __future__ import annotations

import os
import sys

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from . import outputs
from .algorithms.base import ConfigError, check_choice
from .data import DataMissingError, FederatedData
from .functional import ENGINES
from .simulate import Schedule

CONF_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")
GROUPS = ("algo", "data", "model")
PRESETS = "experiment"  # conf/experiment: paper presets that override groups and top-level options


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


def _frac(cfg: DictConfig) -> float | None:
    f = cfg.frac
    if f is not None and (not isinstance(f, (int, float)) or isinstance(f, bool) or not 0 < f <= 1):
        raise ConfigError(f"frac={f!r} must be a fraction in (0, 1] (or null to use clients_per_round)")
    return f


def schedule(cfg: DictConfig, num_clients: int) -> Schedule:
    """The run's schedule from the top-level knobs, each checked with a one-line message."""
    m = _int_option(cfg, "clients_per_round", 1)
    if _frac(cfg) is not None:
        m = max(1, round(cfg.frac * num_clients))
    if m > num_clients:
        raise ConfigError(f"clients_per_round={m} exceeds the {num_clients} clients of the data; allowed: 1..{num_clients}")
    return Schedule(
        rounds=_int_option(cfg, "rounds", 1),
        tau=_int_option(cfg, "tau", 1),
        clients_per_round=m,
        batch_size=_int_option(cfg, "batch_size", 1),
        eval_every=_int_option(cfg, "eval_every", 1),
        personalize_batch=None if cfg.personalize_batch is None else _int_option(cfg, "personalize_batch", 1),
        aggregate=cfg.aggregate or "uniform",
    )


def _optional_int(cfg: DictConfig, key: str, low: int) -> None:
    if cfg[key] is not None:
        _int_option(cfg, key, low)


DATA_INTS = ("num_clients", "dim", "num_classes", "n", "a", "test_a", "chunk_len", "seed")


def validate(cfg: DictConfig) -> list[str]:
    """Every problem with the options that can be checked before any work starts, one line each."""
    problems: list[str] = []

    def check(fn, *args) -> None:
        try:
            fn(*args)
        except ConfigError as e:
            problems.append(str(e))

    for key, low in (("rounds", 1), ("tau", 1), ("clients_per_round", 1), ("batch_size", 1), ("eval_every", 1),
                     ("checkpoint_every", 0), ("max_chunks", 1), ("seed", 0)):
        check(_int_option, cfg, key, low)
    for key in ("personalize_batch", "client_chunk"):
        check(_optional_int, cfg, key, 1)
    check(_frac, cfg)
    if cfg.aggregate is not None:
        check(check_choice, "aggregate", cfg.aggregate, ["uniform", "samples"])
    check(check_choice, "engine", cfg.engine, sorted(ENGINES))
    check(check_choice, "on_diverge", cfg.on_diverge, ["stop", "record"])
    check(resolve_device, str(cfg.device))
    for key in DATA_INTS:
        v = cfg.data.get(key)
        if key in cfg.data and v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < (0 if key == "seed" else 1)):
            problems.append(f"data.{key}={v!r} must be an integer >= {0 if key == 'seed' else 1}")
    if "train_frac" in cfg.data and not (isinstance(cfg.data.train_frac, (int, float)) and 0 < cfg.data.train_frac < 1):
        problems.append(f"data.train_frac={cfg.data.train_frac!r} must be a fraction in (0, 1)")
    for key in ("alpha", "beta"):
        v = cfg.data.get(key)
        if key in cfg.data and (not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0):
            problems.append(f"data.{key}={v!r} must be a number >= 0")
    check(_instantiate, cfg.algo)
    check(lambda: _instantiate(cfg.model, in_features=4, num_classes=2))
    return problems


def _instantiate(node: DictConfig, **kwargs):
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as e:
        cause = e.__cause__ or e
        if isinstance(cause, (ConfigError, DataMissingError, ValueError, TypeError)):  # bad option values
            raise ConfigError(str(cause).splitlines()[0]) from cause
        raise


# Options that may change between a run and its resumption without changing its numbers.
RESUMABLE_CHANGES = ("resume", "progress", "plot", "rounds", "checkpoint_every", "device", "engine", "max_chunks",
                     "client_chunk", "on_diverge", "cache_dir")


def fingerprint(cfg: DictConfig) -> dict:
    """The settings that determine a run's numbers (what a checkpoint must match to be resumed)."""
    c = OmegaConf.to_container(cfg, resolve=True)
    for k in RESUMABLE_CHANGES:
        c.pop(k, None)
    c.get("data", {}).pop("cache_dir", None)
    return c


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(a) | set(b), key=str):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _diff(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {va!r} -> {vb!r}")
    return out


def _checkpoint_folder(path: str) -> str:
    if os.path.isfile(path):
        return os.path.dirname(path)
    sub = os.path.join(path, "checkpoints")
    return sub if os.path.isdir(sub) else path


def find_resume_point(cfg: DictConfig, out_dir: str) -> dict | None:
    """The checkpoint this run continues from, per `resume` (auto | true | false | <path>)."""
    mode = cfg.resume
    if mode is False or mode in ("false", "False"):
        return None
    explicit = mode not in (True, "auto", "true", "True")
    folder = _checkpoint_folder(str(mode)) if explicit else os.path.join(out_dir, "checkpoints")
    if explicit and not os.path.exists(str(mode)):
        raise ConfigError(f"resume={mode!r}: no such file or folder; allowed: auto, true, false, or a run dir / checkpoint path")
    warn = lambda msg: print(msg, file=sys.stderr)
    try:
        ck = outputs.load_checkpoint(folder, warn=warn)
    except outputs.CheckpointError as e:
        raise ConfigError(str(e)) from None
    if ck is None:
        if explicit or mode in (True, "true", "True"):
            raise ConfigError(f"resume={mode!r} but there is no checkpoint in {folder}; use resume=auto or resume=false")
        return None
    diff = _diff(ck["config"], fingerprint(cfg))
    if diff:
        raise ConfigError(
            f"the checkpoint {ck['path']} is of a different configuration ({'; '.join(diff[:5])}); "
            f"run elsewhere (hydra.run.dir=...) or start over with resume=false"
        )
    return ck


def run(cfg: DictConfig, out_dir: str) -> dict:
    """One experiment; writes its files into `out_dir` and returns the summary it writes
    (`fedrun.batched.run_jobs` with one job: the same code runs a batched sweep's groups)."""
    from .batched import run_jobs

    result, = run_jobs([(cfg, out_dir)])
    if isinstance(result, Exception):
        raise result
    return result


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
    from .batched import report, run_jobs

    out_dir = HydraConfig.get().runtime.output_dir
    return report(run_jobs([(cfg, out_dir)])[0], out_dir)


def precheck(argv: list[str]) -> str | None:
    """One-line message for an unknown config group option or key in `argv`, else None.

    Hydra's own messages for these are several lines long; this catches the common typos first.
    """
    choices = {g: None for g in (*GROUPS, PRESETS)}
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if key in (*GROUPS, PRESETS):
            allowed = sorted(f[:-5] for f in os.listdir(os.path.join(CONF_DIR, key)) if f.endswith(".yaml"))
            for v in value.split(","):
                if v not in allowed:
                    return f"{key}={v!r} is not a known {key}; choose one of: {', '.join(allowed)}"
            choices[key] = value.split(",")[0]
    if choices[PRESETS]:  # the groups a preset selects count as chosen unless the command line says otherwise
        preset = OmegaConf.load(os.path.join(CONF_DIR, PRESETS, f"{choices[PRESETS]}.yaml"))
        for d in preset.get("defaults", []):
            for k, v in (d.items() if not isinstance(d, str) else []):
                group = k.replace("override", "").strip(" /")
                if group in GROUPS and choices[group] is None:
                    choices[group] = v
    top = OmegaConf.load(os.path.join(CONF_DIR, "config.yaml"))
    defaults = {list(d)[0]: list(d.values())[0] for d in top.defaults if not isinstance(d, str)}
    for arg in argv:
        if arg.startswith(("-", "+", "~")) or "=" not in arg:
            continue
        key = arg.split("=", 1)[0]
        head, _, rest = key.partition(".")
        if head.split("/")[0] == "hydra" or key in (*GROUPS, PRESETS):  # hydra.* options and hydra/launcher=... groups
            continue
        if head in GROUPS and rest:
            group_cfg = OmegaConf.load(os.path.join(CONF_DIR, head, f"{choices[head] or defaults[head]}.yaml"))
            if rest.split(".")[0] not in group_cfg:
                known = sorted(k for k in group_cfg if not str(k).startswith("_"))
                return f"{key} is not an option of {head}={choices[head] or defaults[head]}; its options: {', '.join(known)}"
        elif head not in top:
            known = sorted(k for k in top if k not in ("defaults", "hydra"))
            return f"unknown option {key!r}; top-level options: {', '.join(known)}, and groups {', '.join((*GROUPS, PRESETS))}"
    return None


def main() -> None:
    problem = precheck(sys.argv[1:])
    if problem:
        print(f"fedrun: error: {problem}", file=sys.stderr)
        sys.exit(2)
    _hydra_main()


if __name__ == "__main__":
    main()

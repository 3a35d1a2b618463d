"""Resuming a run: the settings a checkpoint must match (its fingerprint) and finding the checkpoint."""
from __future__ import annotations

import os
import sys

from omegaconf import DictConfig, OmegaConf

from .. import outputs
from ..algorithms import module_target
from ..algorithms.optim import canonical
from ..config import NEUTRAL_OPTIONS, drop_options, group_file, load_conf
from ..errors import ConfigError

# Options that may change between a run and its resumption: those that do not change the numbers,
# and `rounds` (a finished run continues to more rounds).
RESUMABLE_CHANGES = (*NEUTRAL_OPTIONS, "rounds")


# Options added to fedrun after checkpoints may have been written, with the value that computes what
# a run from before them computed: a checkpoint without the option matches a run with that value.
ADDED_OPTIONS = {"algo.outer_step_from": "w", "data.pad_fill": "mean", "sampling": None, "compile": "none",
                 "precision": "fp32", "optim": None,  # optim: plain SGD (`canonical` drops such a node)
                 "bn": "averaged", "algo.local_epochs": None}


# Data `_target_`s renamed when data became dataset x partition only (2026-11-26): a checkpoint written
# before names the old function of the same rows.
RENAMED_TARGETS = {f"fedrun.data.{name}": f"fedrun.data.presets.{name}"
                   for name in ("synthetic", "mnist_perfedavg", "mnist_pfedme", "mnist_pfedme_authors", "cifar")}


def _shipped_target(group: str, name) -> str | None:
    try:
        return load_conf(group_file(group, str(name))).get("_target_")
    except FileNotFoundError:  # an option this fedrun no longer ships: the diff names it
        return None


def upgrade(config: dict) -> dict:
    """A checkpoint's settings in today's shape, where only names changed and the rows did not: the
    renamed data targets, and a dataset or partition node from before they were classes (a partition
    was picked by its `name` key, a dataset had no `_target_`) given the `_target_` its yaml has now;
    an algorithm's `_target_` from before the yamls named its module (fedrun.algorithms.module_target)."""
    out = dict(config)
    if isinstance(out.get("algo"), dict) and "_target_" in out["algo"]:
        out["algo"] = {**out["algo"], "_target_": module_target(out["algo"]["_target_"])}
    for where in (out, out.get("data") if isinstance(out.get("data"), dict) else None):
        if where is None:
            continue
        if where is out.get("data") and where.get("_target_") in RENAMED_TARGETS:
            where = out["data"] = {**where, "_target_": RENAMED_TARGETS[where["_target_"]]}
        for group in ("dataset", "partition"):
            node = where.get(group)
            if isinstance(node, dict) and "_target_" not in node and "name" in node:
                target = _shipped_target(group, node["name"])
                if target:
                    node = {k: v for k, v in node.items() if not (group == "partition" and k == "name")}
                    where[group] = {"_target_": target, **node}
    return out


def round_schedules(cfg: dict) -> dict:
    """`canonical`, with the algorithm's schedules over the run's rounds made explicit, as cosine's
    t_max is: FedPHP's mu_rounds null and APPLE's decay_rounds null follow `rounds`, so a run resumed
    with more rounds would continue on another schedule than the one its first rounds took; with the
    resolved value in the fingerprint such a resume is refused (one line naming the option)."""
    cfg = canonical(cfg)
    algo, rounds = cfg.get("algo"), cfg.get("rounds")
    if not isinstance(algo, dict) or not isinstance(rounds, int):
        return cfg
    algo = dict(algo)
    if "mu_rounds" in algo and algo["mu_rounds"] is None:
        algo["mu_rounds"] = rounds
    if "decay_rounds" in algo and algo["decay_rounds"] is None and isinstance(algo.get("decay"), (int, float)):
        algo["decay_rounds"] = int(algo["decay"] * rounds)
    return {**cfg, "algo": algo}


def fingerprint(cfg: DictConfig | dict) -> dict:
    """The settings that determine a run's numbers (what a checkpoint must match to be resumed); `cfg`
    the run's config, or the same as a plain resolved dict."""
    tree = cfg if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=True)
    return drop_options(round_schedules(tree), RESUMABLE_CHANGES)


def differences(stored: dict, cfg: DictConfig | dict) -> list[str]:
    """What differs between a checkpoint's stored settings (`fingerprint` as it was written, by this
    fedrun or an older one) and this run's: one line per option; empty: the run may resume from it."""
    # (drop_options on the stored side too: older checkpoints kept options that are resumable changes now)
    return _diff(drop_options(round_schedules(upgrade(stored)), RESUMABLE_CHANGES), fingerprint(cfg))


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(a) | set(b), key=str):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _diff(va, vb, f"{prefix}{k}.")
        elif k not in a and f"{prefix}{k}" in ADDED_OPTIONS:  # a checkpoint from before the option existed
            was = ADDED_OPTIONS[f"{prefix}{k}"]
            if vb != was:
                out.append(f"{prefix}{k}: {vb!r}, but the checkpoint is from before that option and computed "
                           f"{prefix}{k}={'null' if was is None else was}")
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
    return resume_point(cfg.resume, fingerprint(cfg), out_dir)


def resume_point(mode, fp: dict, out_dir: str) -> dict | None:
    """The checkpoint a run of fingerprint `fp` continues from in `out_dir`, per `mode` (the `resume`
    option: auto | true | false | <path>)."""
    if mode is False or mode in ("false", "False"):
        return None
    explicit = mode not in (True, "auto", "true", "True")
    folder = _checkpoint_folder(str(mode)) if explicit else os.path.join(out_dir, "checkpoints")
    if explicit and not os.path.exists(str(mode)):
        raise ConfigError(f"resume={mode!r}: no such file or folder; "
                          f"allowed: auto, true, false, or a run dir / checkpoint path")
    warn = lambda msg: print(msg, file=sys.stderr)
    try:
        if explicit and os.path.isfile(str(mode)):  # that file, whatever its name; no fallback to another
            try:
                ck = outputs.read_checkpoint(str(mode))
            except Exception as e:  # noqa: BLE001 - unreadable: say why, in one line
                first = str(e).splitlines()[0][:200] if str(e) else ""
                raise outputs.CheckpointError(f"resume={mode!r} is not a readable fedrun checkpoint "
                                              f"({type(e).__name__}: {first})") from None
        else:
            ck = outputs.load_checkpoint(folder, warn=warn)
    except outputs.CheckpointError as e:
        raise ConfigError(str(e)) from None
    if ck is None:
        if explicit or mode in (True, "true", "True"):
            raise ConfigError(f"resume={mode!r} but there is no checkpoint in {folder}; "
                              f"use resume=auto or resume=false")
        return None
    return _matching(ck, fp)


def _matching(ck: dict, fp: dict) -> dict:
    """`ck`, if it is of the configuration of fingerprint `fp`; else a ConfigError naming what differs."""
    # (drop_options on the stored side too: older checkpoints kept options that are resumable changes now)
    diff = _diff(drop_options(round_schedules(upgrade(ck["config"])), RESUMABLE_CHANGES), fp)
    if diff:
        raise ConfigError(
            f"the checkpoint {ck['path']} is of a different configuration ({'; '.join(diff[:5])}); "
            f"run elsewhere (hydra.run.dir=...) or start over with resume=false"
        )
    return ck


def resume_point_at(fp: dict, out_dir: str, rnd: int) -> dict | None:
    """The run's own checkpoint of round `rnd` (checkpoints/round_<rnd>.pt), if it is there and
    readable; None otherwise. For the seeds of a batched group that a kill left at different rounds:
    they go back to their common round (fedrun.run.runner). `fp`: the run's fingerprint."""
    path = os.path.join(out_dir, "checkpoints", f"round_{rnd:07d}.pt")
    try:
        ck = outputs.read_checkpoint(path)
    except Exception:  # noqa: BLE001 - missing or unreadable: the caller says what it does instead
        return None
    return _matching(ck, fp)

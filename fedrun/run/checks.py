"""The command line checked before Hydra composes anything (`precheck`), and a sweep job's config
checked before its batch starts (`job_problems`); every other check of the options is RunSpec's
(fedrun.run.spec), the one pass a run makes."""
from __future__ import annotations

import copy
import os

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from ..config import CONF_DIR, GROUPS, PRESETS, group_conf, group_file, group_options, load_conf, search_roots
from ..errors import ConfigError
from .protocol import apply_protocol
from .spec import validate


def job_problems(cfg: DictConfig) -> list[str]:
    """The options' part of RunSpec.from_config (fedrun.run.spec.validate) on a copy of a sweep job's
    config as Hydra composed it (its hydra node dropped, the protocol applied): what the job would
    refuse when it started, before its data is loaded."""
    task = copy.deepcopy(cfg)
    with read_write(task), open_dict(task):
        task.pop("hydra", None)
    try:
        apply_protocol(task)
    except ConfigError as e:
        return [str(e)]
    return validate(task)


def _repeated_sweep_value(argv: list[str]) -> str | None:
    """One line for a swept option that lists a value twice (`seed=0,0`, `algo.lr=0.1,1e-1`): its jobs
    would be one run twice, which a sweep's summary counts as two seeds (13.90 +- 0.00 over "2 seeds")."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        overrides = OverridesParser.create().parse_overrides([a for a in argv if not a.startswith("-") and "=" in a])
    except Exception:  # noqa: BLE001 - Hydra's own error says what is wrong with the syntax
        return None
    for o in overrides:
        if not o.is_sweep_override():
            continue
        try:
            values = list(o.sweep_iterator())
        except Exception:  # noqa: BLE001 - a sweep only Hydra expands (glob over a group): its jobs differ
            continue
        for i, v in enumerate(values):
            if any(type(v) is type(w) and v == w for w in values[:i]):
                return (f"{o.input_line} lists {v!r} twice: its jobs would be "
                        f"the same run, counted as two in the sweep's summary; give each value once")
    return None


def _own_yaml(group: str, name: str, roots: list[str]) -> str:
    """Where a config of one's own goes (fedrun.config.search_roots): `hydra.searchpath` or $FEDRUN_CONF_PATH
    (docs/extending.md); with such folders given, that none of them holds it."""
    if len(roots) > 1:
        return f" ({group}/{name}.yaml is in none of the config folders: {', '.join(roots[1:])})"
    return (f" (your own: {group}/{name}.yaml in a folder given by hydra.searchpath=[file://DIR] or "
            f"FEDRUN_CONF_PATH=DIR, docs/extending.md)")


def precheck(argv: list[str], complete: bool = True) -> str | None:
    """One-line message for an unknown config group option or key in `argv`, else None.

    Hydra's own messages for these are several lines long; this catches the common typos first.
    `complete=False` (for --help) accepts a dataset= without partition= and the other way round.
    """
    repeated = _repeated_sweep_value(argv)
    if repeated:
        return repeated
    roots = search_roots(argv)
    choices = {g: None for g in (*GROUPS, PRESETS)}
    swept = {}  # every option of a swept group (algo=fedavg,fedbn): a group option must exist in each
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if key == "logger":  # trackers: one or several, logger=[tensorboard,mlflow]
            allowed = group_options(key, roots)
            for v in value.strip("[]").split(","):
                if v and v not in allowed:
                    return (f"logger={v!r} is not a known logger; choose one of: {', '.join(allowed)} "
                            f"(several: logger=[a,b])")
        if key in (*GROUPS, PRESETS):
            allowed = group_options(key, roots)
            for v in value.split(","):
                if v not in allowed:
                    return (f"{key}={v!r} is not a known {key}; choose one of: {', '.join(allowed)}"
                            f"{_own_yaml(key, v, roots)}")
            choices[key] = value.split(",")[0]
            swept[key] = value.split(",")
    if choices[PRESETS]:  # the groups a preset selects count as chosen unless the command line says otherwise
        preset = load_conf(group_file(PRESETS, choices[PRESETS], roots))
        for d in preset.get("defaults", []):
            for k, v in (d.items() if not isinstance(d, str) else []):
                group = k.replace("override", "").strip(" /")
                if group in GROUPS and choices[group] is None:
                    choices[group] = v
    # dataset= and partition= are read by the data configs that interpolate them (conf/data/composed.yaml)
    reads = lambda data: "${dataset}" in open(group_file("data", data, roots)).read()
    if choices["data"] and (choices["dataset"] or choices["partition"]) and not reads(choices["data"]):
        return (f"dataset=/partition= compose their own data and cannot go with data={choices['data']}; drop data= "
                f"(the old data= settings stay as they are)")
    if complete and not choices["dataset"] and (choices["partition"] or (choices["data"] and reads(choices["data"]))):
        return (f"data={choices['data'] or 'composed'} needs dataset=<option>; choose one of: "
                f"{', '.join(group_options('dataset', roots))}")
    top = load_conf(os.path.join(CONF_DIR, "config.yaml"))
    defaults = {list(d)[0]: list(d.values())[0] for d in top.defaults if not isinstance(d, str)}
    for arg in argv:  # +key=value too: fedrun reads no option its configs lack (it would be recorded, not used)
        if arg.startswith(("-", "~")) or "=" not in arg:
            continue
        key = arg.split("=", 1)[0].lstrip("+")
        head, _, rest = key.partition(".")
        # hydra.* options and hydra/launcher=... groups; Hydra checks logger.*
        if head.split("/")[0] in ("hydra", "logger") or key in (*GROUPS, PRESETS):
            continue
        if head in GROUPS and rest:
            if not (choices[head] or defaults[head]):
                return f"{key} needs {head}=<option>; choose one of: {', '.join(group_options(head, roots))}"
            for name in swept.get(head) or [choices[head] or defaults[head]]:
                group_cfg = group_conf(head, name, roots)
                if rest.split(".")[0] not in group_cfg:
                    known = sorted(k for k in group_cfg if not str(k).startswith("_"))
                    return f"{key} is not an option of {head}={name}; its options: {', '.join(known)}"
        elif head not in top:
            known = sorted(k for k in top if k not in ("defaults", "hydra"))
            return (f"unknown option {key!r}; top-level options: {', '.join(known)}, "
                    f"and groups {', '.join((*GROUPS, PRESETS))}")
        elif rest and OmegaConf.is_dict(top[head]) and rest.split(".")[0] not in top[head]:  # optim.bogus
            return f"{key} is not an option of {head}; its options: {', '.join(sorted(top[head]))}"
    return None

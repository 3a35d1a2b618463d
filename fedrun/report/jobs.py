"""Finding a sweep's jobs, reading each one's config and status, and grouping them by configuration."""
from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field

import pandas as pd
from omegaconf import OmegaConf

from ..config import group_file, load_conf, neutral_options, read_yaml
from ..hydra_compat import basic_sweep_jobs
from ..outputs import REASON_FILE
from ..run.resume import ADDED_OPTIONS

PREFIXES = ("global", "pers", "new_global", "new_pers")  # new_*: held-out (unseen) clients, `partition.holdout`
MODEL_NAMES = {"global": "global model", "pers": "personalized",
               "new_global": "new clients, global model", "new_pers": "new clients, personalized"}
# config groups (experiment: a preset, when one was used)
GROUPS = ("experiment", "algo", "data", "dataset", "partition", "model")
# Never part of a configuration's identity: the seed (seeds are averaged) and the options that do
# not change the numbers (fedrun.config.NEUTRAL_OPTIONS).
NEUTRAL_KEYS = frozenset(neutral_options("seed"))


@dataclass
class Job:
    path: str
    num: int | None = None
    seed: int | None = None
    key: tuple = ()                      # the configuration's identity: sorted (option, value) pairs
    settings: dict = field(default_factory=dict)
    status: str = "ok"                   # "ok" or why the job is left out
    metrics: pd.DataFrame | None = None
    seconds: float | None = None
    label: str = ""                      # the configuration as shown in the report

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class Group:
    label: str
    settings: dict
    jobs: list[Job]


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, f"{name}."))
        else:
            out[name] = tuple(v) if isinstance(v, list) else v
    return out


def expected_rows(rounds: int, eval_every: int) -> int:
    """Rows a finished run's metrics.csv holds: every `eval_every` rounds and after the last."""
    return rounds // eval_every + (1 if rounds % eval_every else 0)


def find_job_dirs(roots: list[str]) -> list[str]:
    out = []
    for root in roots:
        for dirpath, dirnames, _ in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in (".hydra", ".submitit", "checkpoints"))
            if os.path.isfile(os.path.join(dirpath, ".hydra", "config.yaml")):
                out.append(dirpath)
    return sorted(set(out))


# What a fedrun job's .hydra/config.yaml always holds (another Hydra application's does not)
FEDRUN_OPTIONS = ("algo", "rounds")


def load_job(path: str) -> Job:
    """The job in `path`; one that cannot be read (a corrupt or non-UTF-8 .hydra/ file, another
    application's folder) comes back with its status saying why, to be left out."""
    job = Job(path=path)
    hydra_dir = os.path.join(path, ".hydra")
    hydra_yaml = os.path.join(hydra_dir, "hydra.yaml")
    cfg = hy = None
    for name in ("config.yaml", "hydra.yaml"):
        if name == "hydra.yaml" and not os.path.isfile(hydra_yaml):
            break
        try:
            got = read_yaml(os.path.join(hydra_dir, name)) or {}
        except Exception as e:  # noqa: BLE001 - YAML, UTF-8 or I/O errors: the job is left out, saying which
            where = getattr(e, "problem_mark", None)
            job.status = f"unreadable .hydra/{name} ({type(e).__name__}{f' at line {where.line + 1}' if where else ''})"
            job.num = _folder_num(path, None if name == "hydra.yaml" else hydra_yaml)  # its folder is there: it started
            return job
        cfg, hy = (got, hy) if name == "config.yaml" else (cfg, got)
    if not isinstance(cfg, dict) or not all(k in cfg for k in FEDRUN_OPTIONS):
        job.status = (f"not a fedrun run (its .hydra/config.yaml has no {' or '.join(FEDRUN_OPTIONS)}: "
                      "another application's?)")
        return job
    choices = {}
    if isinstance(hy, dict):
        hy = hy.get("hydra") or {}
        picked = (hy.get("runtime") or {}).get("choices") or {}
        choices = {g: picked[g] for g in GROUPS if picked.get(g) is not None}
        num = (hy.get("job") or {}).get("num")
        job.num = int(num) if isinstance(num, int) and not isinstance(num, bool) else None
    job.seed = cfg.get("seed")
    flat = _flatten(cfg)
    _fill_added_options(flat, choices)
    settings = {g: choices[g] for g in GROUPS if g in choices}
    for k, v in flat.items():
        if k in NEUTRAL_KEYS or k.split(".")[-1] == "_target_" and k.split(".")[0] in choices:
            continue
        settings[k] = v
    job.settings = settings
    # null ("the default / the protocol's") and absent (a job from before the option existed) group together
    job.key = tuple(sorted((k, repr(v)) for k, v in settings.items() if v is not None))
    job.status = _status(job, path, cfg)
    return job


def _folder_num(path: str, hydra_yaml: str | None) -> int | None:
    """The sweep job number of a folder whose config cannot be read: its .hydra/hydra.yaml's, when
    that one reads, else the `<num>_` its name starts with (hydra.sweep.subdir), else None."""
    try:
        num = (((read_yaml(hydra_yaml) or {}).get("hydra") or {}).get("job") or {}).get("num") if hydra_yaml else None
    except Exception:  # noqa: BLE001 - unreadable too: the folder's name
        num = None
    if isinstance(num, int) and not isinstance(num, bool):
        return num
    head = os.path.basename(os.path.normpath(path)).split("_", 1)[0]
    return int(head) if head.isdigit() else None


def _fill_added_options(flat: dict, choices: dict) -> None:
    """A job from before an option existed computed the option's `resume.ADDED_OPTIONS` value: fill
    it in, so the job groups with jobs that set that value, where the option's group (as the job
    chose it, e.g. data=cifar10_acid) now defines it with a non-null default. (A null default needs
    nothing: null and absent already group together.)"""
    for key, was in ADDED_OPTIONS.items():
        group, _, name = key.partition(".")
        if key not in flat and was is not None and name and group in choices \
                and _group_default(group, choices[group], name) is not None:
            flat[key] = was


@functools.lru_cache(maxsize=None)
def _group_default(group: str, choice: str, name: str):
    """conf/<group>/<choice>.yaml's value of `name` (None: absent, null, or a user's config folder's option)."""
    try:
        return load_conf(group_file(group, choice)).get(name)
    except FileNotFoundError:
        return None


def _status(job: Job, path: str, cfg: dict) -> str:
    summary_path, metrics_path = os.path.join(path, "summary.json"), os.path.join(path, "metrics.csv")
    reason = _reason(path)
    if reason is not None:  # a failed sweep job: its own words
        return f"failed: {reason}"
    summary = None
    if os.path.isfile(summary_path):
        try:
            with open(summary_path, encoding="utf-8") as f:
                summary = json.load(f)
        except (OSError, ValueError):  # (UnicodeDecodeError is a ValueError)
            return "unreadable summary.json (torn, or not UTF-8 JSON)"
        if not isinstance(summary, dict):
            return f"summary.json holds a JSON {type(summary).__name__}, not a fedrun summary"
        if summary.get("status", "finished") != "finished":
            err = str(summary.get("error", "")).splitlines()[0][:160] if summary.get("error") else ""
            said = ("diverged" if summary.get("status") == "diverged"
                    else f"summary.json says status={summary.get('status')!r}")
            return said + (f": {err}" if err else "")
    if not os.path.isfile(metrics_path):
        return "no metrics.csv: it started, then stopped before its first evaluation (killed, or still running)"
    torn = torn_row(metrics_path)
    if torn:
        return f"metrics.csv {torn}"
    try:
        job.metrics = pd.read_csv(metrics_path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError) as e:
        return f"unreadable metrics.csv ({type(e).__name__})"
    rounds, every = cfg.get("rounds"), cfg.get("eval_every", 1)
    want = expected_rows(rounds, every) if isinstance(rounds, int) and isinstance(every, int) and every > 0 else None
    have = len(job.metrics)
    if summary is None:
        return f"no summary.json (failed, killed or still running; metrics.csv has {have} of {want} rows)"
    job.seconds = summary.get("seconds")
    if want is not None and (have < want or int(job.metrics["round"].iloc[-1]) != rounds):
        return (f"incomplete: metrics.csv has {have} of {want} rows "
                f"(last round {job.metrics['round'].iloc[-1] if have else None} of {rounds})")
    return "ok"


def _reason(path: str) -> str | None:
    """The one-line reason a failed sweep job left in its folder (None: none)."""
    try:
        with open(os.path.join(path, REASON_FILE), encoding="utf-8", errors="replace") as f:
            return (f.readline().strip() or "no reason given")[:300]
    except OSError:
        return None


def torn_row(path: str) -> str | None:
    """Why `path` (a metrics.csv) cannot be read as a run's rows, or None: every row ends in a
    newline and has the header's number of fields (pandas would read a cut row's missing fields as
    NaN), the text is UTF-8, every round is a whole number, every accuracy a finite one."""
    import csv

    try:
        with open(path, newline="", encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        return f"is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})"
    if text and not text.endswith("\n"):
        return (f"ends in a half-written row (line {text.count(chr(10)) + 1} has no end); "
                "rerun the job's command to redo it")
    rows = list(csv.reader(text.splitlines()))
    accuracies = [i for i, name in enumerate(rows[0] if rows else [])
                  if name.endswith(("_acc", "_acc_min", "_acc_max"))]
    for i, row in enumerate(rows[1:], start=2):
        if len(row) != len(rows[0]) or any(v == "" for v in row[:1]):
            return (f"has a half-written row (line {i}: {len(row)} of {len(rows[0])} fields); "
                    "rerun the job's command to redo it")
        if not row[0].isdigit():
            return f"has round {row[0]!r} on line {i}, not a round number"
        bad = [rows[0][j] for j in accuracies if row[j].strip().lower() in ("nan", "inf", "-inf", "+inf")]
        if bad:
            return (f"has non-finite accuracies on line {i} "
                    f"({', '.join(bad)}: {row[rows[0].index(bad[0])]}; a diverged run?)")
    return None


def group_jobs(jobs: list[Job]) -> list[Group]:
    """Groups the jobs that finished by configuration, labelled by the options that vary between groups."""
    by_key: dict[tuple, list[Job]] = {}
    first: dict[tuple, Job] = {}  # (configuration, seed) -> the job that counts for it
    for j in jobs:
        if j.ok:
            kept = first.setdefault((j.key, j.seed), j)
            if kept is not j:  # (two sweeps over the same runs, `seed=0,0`): a seed counts once in the mean
                j.status = f"the same configuration and seed as {kept.path}: counted once"
                continue
            by_key.setdefault(j.key, []).append(j)
    keys = list(by_key)
    configs = [by_key[k][0].settings for k in keys]
    varying = _varying(configs, strict=False)
    labels = [_label(c, varying) for c in configs]
    if len(set(labels)) < len(labels):  # options present in some configurations only tell them apart
        varying = _varying(configs, strict=True)
        labels = [_label(c, varying) for c in configs]
    groups = []
    for key, label in zip(keys, labels):
        members = by_key[key]
        settings = members[0].settings
        members.sort(key=lambda j: (j.seed if isinstance(j.seed, int) else 0, j.path))
        groups.append(Group(label=label, settings={o: settings[o] for o in varying if o in settings}, jobs=members))
    groups.sort(key=lambda g: [_sort_key(g.settings.get(o)) for o in varying] + [g.label])
    for g in groups:
        for j in g.jobs:
            j.label = g.label
    # jobs left out: labelled by the options that tell every job apart, theirs included (a job failed
    # by an option that no finished job has keeps that option in its label)
    every = _varying(configs + [j.settings for j in jobs if not j.ok], strict=False)
    for j in jobs:
        if not j.ok:
            j.label = next((g.label for g in groups if g.jobs[0].key == j.key), None) or _label(j.settings, every)
    return groups


def _varying(configs: list[dict], strict: bool) -> list[str]:
    """Options whose value differs between configurations: among those that have the option, or,
    with `strict`, counting a missing option as a value of its own. Config groups first."""
    opts = sorted({o for c in configs for o in c})
    missing = object()
    out = []
    for o in opts:
        vals = {c.get(o, missing) for c in configs} if strict else {c[o] for c in configs if o in c}
        if len(vals) > 1:
            out.append(o)
    return sorted(out, key=lambda o: (o not in GROUPS, GROUPS.index(o) if o in GROUPS else 0, o))


def _label(config: dict, varying: list[str]) -> str:
    shown = [o for o in varying if o in config] or [g for g in GROUPS if g in config]
    return ", ".join(f"{o}={_short(config[o])}" for o in shown)


def _short(v) -> str:
    if isinstance(v, tuple):
        return "[" + ",".join(map(str, v)) + "]"
    return str(v)


def _sort_key(v):
    if isinstance(v, bool) or v is None:
        return (1, str(v))
    if isinstance(v, (int, float)):
        return (0, v)
    return (1, str(v))


def sweep_jobs(sweep_dir: str) -> list[list[str]] | None:
    """The jobs a `fedrun -m` sweep folder was to hold, in job-number order, each as its swept overrides,
    from the multirun.yaml Hydra writes there before the first job (None: no such file, or a
    sweeper other than Hydra's basic one)."""
    path = os.path.join(sweep_dir, "multirun.yaml")
    if not os.path.isfile(path):
        return None
    try:
        hy = OmegaConf.load(path).hydra
        if "BasicSweeper" not in str(OmegaConf.select(hy, "sweeper._target_", default="BasicSweeper")):
            return None
        params = OmegaConf.select(hy, "sweeper.params", default=None) or {}
        args = [f"{k}={v}" for k, v in params.items()] + list(hy.overrides.task)
        planned = basic_sweep_jobs(args)
        swept = [i for i in range(len(planned[0])) if len({job[i] for job in planned}) > 1] if planned else []
        return [[job[i] for i in swept] for job in planned]  # the overrides that tell the jobs apart
    except Exception:  # noqa: BLE001 - a sweep folder we cannot read is reported from its job folders alone
        return None


def missing_jobs(jobs: list[Job], roots: list[str]) -> list[str]:
    """One line per job of a sweep under `roots` that never started (a job before it stopped the
    sweep; a failed job keeps its folder and reason, `REASON_FILE`). Sweep folders without multirun.yaml: the gaps
    in the job numbers found (`missing_job_numbers`)."""
    found: dict[str, set[int]] = {}
    for j in jobs:
        if j.num is not None:
            found.setdefault(os.path.abspath(os.path.dirname(j.path)), set()).add(j.num)
    sweeps = {os.path.abspath(d) for root in roots for d, _, files in os.walk(root) if "multirun.yaml" in files}
    out, rest = [], []
    for sweep in sorted(sweeps | set(found)):
        planned = sweep_jobs(sweep) if sweep in sweeps else None
        if planned is None:
            rest += [j for j in jobs if j.num is not None and os.path.abspath(os.path.dirname(j.path)) == sweep]
            continue
        for num, overrides in enumerate(planned):
            if num not in found.get(sweep, set()):
                out.append(f"{sweep}: job {num} ({' '.join(overrides)}) never started (no folder: "
                           f"the sweep stopped before it)")
    return out + missing_job_numbers(rest)


def missing_job_numbers(jobs: list[Job]) -> list[str]:
    """Multirun job numbers absent from a sweep folder (jobs that never wrote a folder)."""
    out = []
    by_sweep: dict[str, set[int]] = {}
    for j in jobs:
        if j.num is not None:
            by_sweep.setdefault(os.path.dirname(j.path), set()).add(j.num)
    for sweep, nums in sorted(by_sweep.items()):
        gaps = sorted(set(range(max(nums) + 1)) - nums)
        if gaps:
            out.append(f"{sweep}: no folder for job number(s) {', '.join(map(str, gaps))} (never started?)")
    return out

"""`fedrun-report DIR [DIR ...]`: one table and one figure from the runs of a sweep.

Finds every job under the given folders (a folder holding `.hydra/config.yaml`, as Hydra writes for
each run and for each job of a multirun), groups the jobs by configuration (the job's composed
config with the seed and the options that do not change the numbers left out), and writes next to
the runs (or into --out):

- `summary.csv`: one row per configuration; mean and std over seeds of the last-round and of the
  best-round accuracy, of the lowest and highest client accuracy of the last round and of the best
  round, and of the rounds and of the models transmitted (metrics.csv `models_transmitted` at that
  round) needed to reach each --target accuracy, for the global and the personalized models; with
  --baseline, the gain of every configuration over it: baseline's transmissions / its own (paper
  004, Tables 1-2);
- `summary.md`: the same as a Markdown table (percent), followed by the jobs left out;
- `summary.png`: mean accuracy curves over seeds with +- std bands, one line per configuration;
- `jobs.csv`: every job found, its configuration, seed and status.

All numbers come from each job's `metrics.csv`. A job is left out, and listed with its reason,
when it has no `summary.json` (failed, killed or still running), when its summary says it did not
finish, or when its `metrics.csv` has fewer rows than its `rounds` and `eval_every` promise.
Std is the sample standard deviation (ddof=1); it is empty for a configuration with one seed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field

import pandas as pd
from omegaconf import OmegaConf

PREFIXES = ("global", "pers")
MODEL_NAMES = {"global": "global model", "pers": "personalized"}
GROUPS = ("experiment", "algo", "data", "model")  # config groups (experiment: a preset, when one was used)
# Options that do not change a run's numbers: never part of a configuration's identity.
NEUTRAL_KEYS = {
    "seed", "device", "progress", "plot", "cache_dir", "max_chunks", "client_chunk", "checkpoint_every",
    "resume", "on_diverge", "data.cache_dir", "data.download", "data.chunk_len",
}


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


def load_job(path: str) -> Job:
    job = Job(path=path)
    hydra_dir = os.path.join(path, ".hydra")
    cfg = OmegaConf.to_container(OmegaConf.load(os.path.join(hydra_dir, "config.yaml")), resolve=False)
    choices = {}
    hydra_yaml = os.path.join(hydra_dir, "hydra.yaml")
    if os.path.isfile(hydra_yaml):
        hy = OmegaConf.load(hydra_yaml).hydra
        choices = {g: hy.runtime.choices.get(g) for g in GROUPS if hy.runtime.choices.get(g) is not None}
        num = OmegaConf.select(hy, "job.num", default=None)
        job.num = int(num) if isinstance(num, int) else None
    job.seed = cfg.get("seed")
    flat = _flatten(cfg)
    settings = {g: choices[g] for g in GROUPS if g in choices}
    for k, v in flat.items():
        if k in NEUTRAL_KEYS or k.split(".")[-1] == "_target_" and k.split(".")[0] in choices:
            continue
        settings[k] = v
    job.settings = settings
    job.key = tuple(sorted((k, repr(v)) for k, v in settings.items()))
    job.status = _status(job, path, cfg)
    return job


def _status(job: Job, path: str, cfg: dict) -> str:
    summary_path, metrics_path = os.path.join(path, "summary.json"), os.path.join(path, "metrics.csv")
    if not os.path.isfile(metrics_path):
        return "no metrics.csv (failed before the first evaluation, or never started)"
    try:
        job.metrics = pd.read_csv(metrics_path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError) as e:
        return f"unreadable metrics.csv ({type(e).__name__})"
    rounds, every = cfg.get("rounds"), cfg.get("eval_every", 1)
    want = expected_rows(rounds, every) if isinstance(rounds, int) and isinstance(every, int) and every > 0 else None
    have = len(job.metrics)
    if not os.path.isfile(summary_path):
        return f"no summary.json (failed, killed or still running; metrics.csv has {have} of {want} rows)"
    try:
        with open(summary_path) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return "unreadable summary.json"
    job.seconds = summary.get("seconds")
    if summary.get("status", "finished") != "finished":
        err = str(summary.get("error", "")).splitlines()[0][:160] if summary.get("error") else ""
        return f"summary.json says status={summary.get('status')!r}" + (f": {err}" if err else "")
    if want is not None and (have < want or int(job.metrics["round"].iloc[-1]) != rounds):
        return f"incomplete: metrics.csv has {have} of {want} rows (last round {job.metrics['round'].iloc[-1] if have else None} of {rounds})"
    return "ok"


def group_jobs(jobs: list[Job]) -> list[Group]:
    """Groups the jobs that finished by configuration, labelled by the options that vary between groups."""
    by_key: dict[tuple, list[Job]] = {}
    for j in jobs:
        if j.ok:
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
    for j in jobs:  # jobs left out: labelled the same way, for the list of what is missing
        if not j.ok:
            j.label = next((g.label for g in groups if g.jobs[0].key == j.key), None) or _label(j.settings, varying)
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


def rounds_to_reach(metrics: pd.DataFrame, column: str, target: float) -> float:
    """First round whose `column` is >= target; NaN when never reached."""
    hit = metrics.loc[metrics[column] >= target, "round"]
    return float(hit.iloc[0]) if len(hit) else math.nan


def transmitted_to_reach(metrics: pd.DataFrame, column: str, target: float) -> float:
    """`models_transmitted` at the first row whose `column` is >= target; NaN when never reached."""
    hit = metrics.loc[metrics[column] >= target, "models_transmitted"]
    return float(hit.iloc[0]) if len(hit) else math.nan


def target_name(target: float) -> str:
    pct = round(target * 100, 4)
    return f"{pct:g}pct"


def job_values(job: Job, targets: list[float]) -> dict:
    m = job.metrics
    last = m.iloc[-1]
    out = {}
    for p in PREFIXES:
        col = f"{p}_acc"
        if col not in m:
            continue
        out[f"{p}_acc_last_round"] = float(last[col])
        out[f"{p}_acc_best_round"] = float(m[col].max())
        out[f"{p}_acc_client_min_last_round"] = float(last[f"{p}_acc_min"])
        out[f"{p}_acc_client_max_last_round"] = float(last[f"{p}_acc_max"])
        best = m.loc[m[col].idxmax()]  # the first row with the highest accuracy
        out[f"{p}_best_round"] = float(best["round"])
        out[f"{p}_acc_client_min_best_round"] = float(best[f"{p}_acc_min"])
        out[f"{p}_acc_client_max_best_round"] = float(best[f"{p}_acc_max"])
        for t in targets:
            out[f"{p}_rounds_to_{target_name(t)}"] = rounds_to_reach(m, col, t)
            if "models_transmitted" in m:
                out[f"{p}_transmitted_to_{target_name(t)}"] = transmitted_to_reach(m, col, t)
    if "models_transmitted" in m:
        out["transmitted_last_round"] = float(last["models_transmitted"])
    return out


def summarize(groups: list[Group], targets: list[float]) -> pd.DataFrame:
    option_columns = list(dict.fromkeys(o for g in groups for o in g.settings))
    rows = []
    for g in groups:
        per_job = pd.DataFrame([job_values(j, targets) for j in g.jobs])
        row = {"config": g.label, **{o: _short(g.settings[o]) if o in g.settings else "" for o in option_columns}}
        row["n_seeds"] = len(g.jobs)
        row["seeds"] = " ".join(str(j.seed) for j in g.jobs)
        row["rounds"] = int(g.jobs[0].metrics["round"].iloc[-1])
        for col in per_job.columns:
            vals = per_job[col]
            if "_rounds_to_" in col or "_transmitted_to_" in col:
                reached = int(vals.notna().sum())
                row[f"{col}_reached"] = f"{reached}/{len(vals)}"
                if "_transmitted_to_" in col:  # what every seed needed at least: its own count, or all it sent
                    row[f"{col}_at_least"] = float(vals.fillna(per_job["transmitted_last_round"]).mean())
                if reached < len(vals):  # a mean over the seeds that got there would flatter the configuration
                    row[f"{col}_mean"], row[f"{col}_std"] = math.nan, math.nan
                    continue
            row[f"{col}_mean"] = float(vals.mean())
            row[f"{col}_std"] = float(vals.std(ddof=1)) if len(vals) > 1 else math.nan
        secs = [j.seconds for j in g.jobs if isinstance(j.seconds, (int, float))]
        row["seconds_mean"] = float(sum(secs) / len(secs)) if secs else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def gain(base_mean: float, base_at_least: float, mean: float, at_least: float) -> tuple[float, str]:
    """Paper 004's gain (Tables 1-2): the baseline's transmissions to reach a target / a method's.

    The means count only when every seed reached the target; otherwise `*_at_least` (the mean over
    seeds of what each needed, or of all it sent when it never got there) bounds them from below.
    Returns (ratio, bound): bound "" when both reached it, ">" (a lower bound) when only the method
    did, "<" (an upper bound) when only the baseline did; (NaN, "") when neither did.
    """
    def ok(v):
        return v is not None and not (isinstance(v, float) and math.isnan(v))

    if ok(base_mean) and ok(mean):
        return base_mean / mean, ""
    if ok(mean) and ok(base_at_least):
        return base_at_least / mean, ">"
    if ok(base_mean) and ok(at_least) and at_least > 0:
        return base_mean / at_least, "<"
    return math.nan, ""


def find_baseline(groups: list[Group], name: str) -> Group:
    """The configuration `name` names: its label, or the preset (`experiment`) or `algo` it ran;
    a ValueError with one line when none or several match."""
    exact = [g for g in groups if g.label == name]
    if exact:
        return exact[0]
    hits = [g for g in groups if name in (g.jobs[0].settings.get("experiment"), g.jobs[0].settings.get("algo"))]
    labels = "; ".join(g.label for g in groups)
    if not hits:
        raise ValueError(f"--baseline {name!r} names no configuration (give a label, a preset or an algo; have: {labels})")
    if len(hits) > 1:
        raise ValueError(f"--baseline {name!r} matches {len(hits)} configurations ({'; '.join(g.label for g in hits)}); "
                         f"give one of their labels")
    return hits[0]


def add_gains(table: pd.DataFrame, baseline_label: str, targets: list[float]) -> pd.DataFrame:
    """Adds `baseline` and, per model and target, `{p}_gain_to_{X}pct` (baseline transmissions /
    the row's) and `{p}_gain_to_{X}pct_bound` ("", ">" or "<", see `gain`)."""
    table = table.copy()
    base = table.set_index("config").loc[baseline_label]
    table["baseline"] = baseline_label
    for p in PREFIXES:
        for t in targets:
            c = f"{p}_transmitted_to_{target_name(t)}"
            if f"{c}_mean" not in table:
                continue
            vals = [gain(base[f"{c}_mean"], base[f"{c}_at_least"], r[f"{c}_mean"], r[f"{c}_at_least"])
                    for _, r in table.iterrows()]
            table[f"{p}_gain_to_{target_name(t)}"] = [v for v, _ in vals]
            table[f"{p}_gain_to_{target_name(t)}_bound"] = [b for _, b in vals]
    return table


def mean_curve(jobs: list[Job], column: str) -> pd.DataFrame:
    """round, mean, std (ddof=1, NaN for one job), n over the jobs at every round they all have."""
    frames = [j.metrics.set_index("round")[column] for j in jobs if column in j.metrics]
    if not frames:
        return pd.DataFrame(columns=["round", "mean", "std", "n"])
    wide = pd.concat(frames, axis=1, join="inner")
    return pd.DataFrame({"round": wide.index.to_numpy(), "mean": wide.mean(axis=1).to_numpy(),
                         "std": wide.std(axis=1, ddof=1).to_numpy() if wide.shape[1] > 1 else math.nan,
                         "n": wide.shape[1]})


def _pm(mean, std, scale=100.0, digits=2) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return ""
    s = f"{mean * scale:.{digits}f}"
    if std is not None and not (isinstance(std, float) and math.isnan(std)):
        s += f" ± {std * scale:.{digits}f}"
    return s


def _not_reached(reached, at_least=None) -> str:
    if not isinstance(reached, str):  # the configuration has no such model (e.g. no personalized one)
        return ""
    more = "" if at_least is None or at_least != at_least else f" (> {at_least:.0f} sent)"
    return ("not reached" if reached.startswith("0/") else f"reached by {reached} seeds only") + more


def gain_cell(value: float, bound: str) -> str:
    return "" if value != value else f"{bound}{value:.2f}×"


def markdown(table: pd.DataFrame, left_out: list[Job], missing: list[str], targets: list[float], title: str) -> str:
    baseline = table["baseline"].iloc[0] if "baseline" in table and len(table) else None
    lines = [f"# {title}", "",
             "Accuracy in %, mean ± std (sample std) over seeds. *last round*: the final round's accuracy; "
             "*best round*: the highest accuracy over the evaluated rounds; *lowest/highest client*: over "
             "clients, at the last round and at the best round; *rounds to X%*: first round whose accuracy "
             "reached X% (empty unless every seed reached it); *transmissions to X%*: models sent to the server "
             "up to that round (metrics.csv `models_transmitted`); *not reached (> N sent)*: N is the mean over "
             "seeds of what each sent, counting all a run sent when it never got there."
             + (f" *gain*: {baseline}'s transmissions / the configuration's (paper 004, Tables 1-2); "
                "'>': a lower bound (the baseline never got there), '<': an upper bound." if baseline else ""), ""]
    prefixes = [p for p in PREFIXES if f"{p}_acc_last_round_mean" in table]
    sent = {p: bool(targets) and f"{p}_transmitted_to_{target_name(targets[0])}_mean" in table for p in prefixes}
    head = ["configuration", "seeds", "rounds"]
    for p in prefixes:
        name = MODEL_NAMES[p]
        head += [f"{name}: last round", f"{name}: best round", f"{name}: lowest client", f"{name}: highest client",
                 f"{name}: lowest client (best round)", f"{name}: highest client (best round)"]
        head += [f"{name}: rounds to {t * 100:g}%" for t in targets]
        if sent[p]:
            head += [f"{name}: transmissions to {t * 100:g}%" for t in targets]
            if baseline:
                head += [f"{name}: gain at {t * 100:g}%" for t in targets]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in table.iterrows():
        cells = [str(r["config"]), str(r["n_seeds"]), str(r["rounds"])]
        for p in prefixes:
            for what in ("acc_last_round", "acc_best_round", "acc_client_min_last_round", "acc_client_max_last_round",
                         "acc_client_min_best_round", "acc_client_max_best_round"):
                cells.append(_pm(r[f"{p}_{what}_mean"], r[f"{p}_{what}_std"]))
            for t in targets:
                c = f"{p}_rounds_to_{target_name(t)}"
                val = _pm(r[f"{c}_mean"], r[f"{c}_std"], scale=1.0, digits=1)
                cells.append(val or _not_reached(r[f"{c}_reached"]))
            if sent[p]:
                for t in targets:
                    c = f"{p}_transmitted_to_{target_name(t)}"
                    val = _pm(r[f"{c}_mean"], r[f"{c}_std"], scale=1.0, digits=1)
                    cells.append(val or _not_reached(r[f"{c}_reached"], r[f"{c}_at_least"]))
                if baseline:
                    for t in targets:
                        c = f"{p}_gain_to_{target_name(t)}"
                        cells.append(gain_cell(r[c], r[f"{c}_bound"]))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if left_out or missing:
        lines += ["## Jobs left out (not averaged)", ""]
        for j in left_out:
            lines.append(f"- {j.label}, seed {j.seed}: {j.status} (`{j.path}`)")
        for m in missing:
            lines.append(f"- {m}")
        lines.append("")
    else:
        lines += ["All jobs finished and are included.", ""]
    return "\n".join(lines)


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


@dataclass
class Report:
    jobs: list[Job]
    groups: list[Group]
    table: pd.DataFrame
    left_out: list[Job]
    missing: list[str]
    files: dict


def build(roots: list[str], targets: list[float] | None = None,
          baseline: str | None = None) -> tuple[list[Job], list[Group], pd.DataFrame]:
    """Jobs, configurations and the summary table; with `baseline` (a label, preset or algo name,
    see `find_baseline`) the table gains the gain columns of `add_gains`."""
    jobs = [load_job(p) for p in find_job_dirs(roots)]
    groups = group_jobs(jobs)
    targets = list(targets or [])
    table = summarize(groups, targets)
    if baseline is not None and groups:
        table = add_gains(table, find_baseline(groups, baseline).label, targets)
    return jobs, groups, table


def write_report(roots: list[str], out_dir: str | None = None, targets: list[float] | None = None,
                 figure: bool = True, title: str | None = None, baseline: str | None = None) -> Report:
    from . import outputs

    targets = list(targets or [])
    out_dir = out_dir or roots[0]
    if baseline is not None and not targets:
        raise ValueError("--baseline needs at least one --target (the gain is in transmissions to reach it)")
    jobs, groups, table = build(roots, targets, baseline)
    if not jobs:
        raise FileNotFoundError(f"no runs under {', '.join(roots)} (looked for <job>/.hydra/config.yaml)")
    left_out = [j for j in jobs if not j.ok]
    missing = missing_job_numbers(jobs)
    os.makedirs(out_dir, exist_ok=True)
    files = {}
    if len(table):
        files["summary.csv"] = os.path.join(out_dir, "summary.csv")
        table.to_csv(files["summary.csv"] + ".tmp", index=False)
        os.replace(files["summary.csv"] + ".tmp", files["summary.csv"])
    title = title or f"fedrun report: {', '.join(os.path.basename(os.path.abspath(r)) for r in roots)}"
    files["summary.md"] = os.path.join(out_dir, "summary.md")
    outputs.write_atomic(files["summary.md"], markdown(table, left_out, missing, targets, title) if len(table) else
                         markdown(pd.DataFrame(columns=["config"]), left_out, missing, [], title))
    files["jobs.csv"] = os.path.join(out_dir, "jobs.csv")
    outputs.write_csv(files["jobs.csv"], [
        {"job": os.path.relpath(j.path, out_dir), "num": j.num, "seed": j.seed, "config": j.label,
         "status": j.status, "rows": None if j.metrics is None else len(j.metrics)} for j in jobs])
    if figure and groups:
        from .plots import plot_curve_panels

        panels = []
        for p in PREFIXES:
            curves = {g.label: mean_curve(g.jobs, f"{p}_acc") for g in groups}
            curves = {k: v for k, v in curves.items() if len(v)}
            if curves:
                panels.append((f"{MODEL_NAMES[p]} accuracy", curves))
        files["summary.png"] = os.path.join(out_dir, "summary.png")
        plot_curve_panels(panels, files["summary.png"], ylabel="test accuracy (pooled over clients)",
                          suptitle="mean over seeds, band: ± std")
    return Report(jobs, groups, table, left_out, missing, files)


def parse_targets(values: list[str]) -> list[float]:
    """'0.8', '80', '80%' or comma-separated lists of them -> fractions (values above 1 are percent)."""
    out = []
    for v in values:
        for part in str(v).split(","):
            part = part.strip().rstrip("%")
            if not part:
                continue
            try:
                t = float(part)
            except ValueError:
                raise ValueError(f"--target {part!r} is not a number (give the folders before --target)") from None
            t = t / 100 if t > 1 else t
            if not 0 < t <= 1:
                raise ValueError(f"--target {part!r} must be an accuracy in (0, 1] or a percent in (1, 100]")
            out.append(t)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fedrun-report", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="e.g. fedrun-report outputs/multirun/2026-01-01_12-00-00 --target 80 90 --baseline perfedavg")
    ap.add_argument("dirs", nargs="+", help="multirun folder(s) or run folders; searched recursively for jobs")
    ap.add_argument("--target", nargs="+", default=[], metavar="ACC",
                    help="accuracies for 'rounds to reach' (0.8, 80 or 80%%; lists allowed: 80,90)")
    ap.add_argument("--baseline", default=None, metavar="CONFIG",
                    help="gain vs this configuration (its label in summary.md, or the preset / algo it ran): its "
                         "models transmitted to reach each --target / each configuration's (paper 004, Tables 1-2)")
    ap.add_argument("--out", default=None, help="folder for summary.csv/.md/.png and jobs.csv (default: the first DIR)")
    ap.add_argument("--no-figure", action="store_true", help="skip summary.png")
    args = ap.parse_args(argv)
    for d in args.dirs:
        if not os.path.isdir(d):
            print(f"fedrun-report: error: {d} is not a folder", file=sys.stderr)
            return 2
    try:
        targets = parse_targets(args.target)
        rep = write_report(args.dirs, args.out, targets, figure=not args.no_figure, baseline=args.baseline)
    except (ValueError, FileNotFoundError) as e:
        print(f"fedrun-report: error: {e}", file=sys.stderr)
        return 2
    n_ok = sum(j.ok for j in rep.jobs)
    print(f"fedrun-report: {len(rep.jobs)} jobs, {n_ok} finished, {len(rep.groups)} configurations")
    for j in rep.left_out:
        print(f"fedrun-report: left out {j.path}: {j.status}")
    for m in rep.missing:
        print(f"fedrun-report: missing: {m}")
    for name, path in rep.files.items():
        print(f"fedrun-report: wrote {path}")
    return 0


def _console() -> None:
    sys.exit(main())


if __name__ == "__main__":
    _console()

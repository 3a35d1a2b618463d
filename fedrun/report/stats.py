"""Numbers per job and per configuration: accuracies, rounds and transmissions to a target, gains."""
from __future__ import annotations

import math

import pandas as pd

from .jobs import PREFIXES, Group, Job, _short


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


def seed_stats(vals: pd.Series, col: str, sent_last: pd.Series | None = None) -> dict:
    """One value per seed -> {mean, std} (ddof=1, NaN for one seed); for a count to a target
    (`_rounds_to_` / `_transmitted_to_` in `col`, NaN where a seed never got there) also `reached`
    ("k/n"), the mean and std then NaN unless every seed got there, and with `sent_last` (each
    seed's models sent by its last round) `at_least`: the mean over seeds of its count, or of all it
    sent when it never got there."""
    out = {}
    if "_rounds_to_" in col or "_transmitted_to_" in col:
        reached = int(vals.notna().sum())
        out["reached"] = f"{reached}/{len(vals)}"
        if sent_last is not None:  # what every seed needed at least: its own count, or all it sent
            out["at_least"] = float(vals.fillna(sent_last).mean())
        if reached < len(vals):  # a mean over the seeds that got there would flatter the configuration
            return {**out, "mean": math.nan, "std": math.nan}
    out["mean"] = float(vals.mean())
    out["std"] = float(vals.std(ddof=1)) if len(vals) > 1 else math.nan
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
            sent = per_job["transmitted_last_round"] if "_transmitted_to_" in col else None
            row.update({f"{col}_{k}": v for k, v in seed_stats(per_job[col], col, sent).items()})
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
        raise ValueError(f"--baseline {name!r} names no configuration "
                         f"(give a label, a preset or an algo; have: {labels})")
    if len(hits) > 1:
        raise ValueError(f"--baseline {name!r} matches {len(hits)} configurations "
                         f"({'; '.join(g.label for g in hits)}); give one of their labels")
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

"""summary.md: the table a reader compares, as Markdown (percent)."""
from __future__ import annotations

import math

import pandas as pd

from .jobs import MODEL_NAMES, PREFIXES, Job
from .stats import target_name

# What summary.md shows per model, first: the numbers a reader compares (the rest is in summary.csv).
MD_COLUMNS = {"acc_last_round": "last round", "acc_best_round": "best round",
              "acc_client_min_last_round": "lowest client"}


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
             "*best round*: the highest accuracy over the evaluated rounds; *lowest client*: the lowest client "
             "accuracy at the last round (summary.csv also has the highest client, both at the best round, "
             "and every std); *rounds to X%*: first round whose accuracy "
             "reached X% (empty unless every seed reached it); *transmissions to X%*: models sent to the server "
             "up to that round (metrics.csv `models_transmitted`); *not reached (> N sent)*: N is the mean over "
             "seeds of what each sent, counting all a run sent when it never got there."
             + (f" *gain*: {baseline}'s transmissions / the configuration's (paper 004, Tables 1-2); "
                "'>': a lower bound (the baseline never got there), '<': an upper bound." if baseline else ""), ""]
    prefixes = [p for p in PREFIXES if f"{p}_acc_last_round_mean" in table]
    sent = {p: bool(targets) and f"{p}_transmitted_to_{target_name(targets[0])}_mean" in table for p in prefixes}
    head = ["configuration", "seeds", "rounds"]
    for p in prefixes:  # first what every reader compares, for each model; then the targets
        head += [f"{MODEL_NAMES[p]}: {what}" for what in MD_COLUMNS.values()]
    for p in prefixes:
        name = MODEL_NAMES[p]
        head += [f"{name}: rounds to {t * 100:g}%" for t in targets]
        if sent[p]:
            head += [f"{name}: transmissions to {t * 100:g}%" for t in targets]
            if baseline:
                head += [f"{name}: gain at {t * 100:g}%" for t in targets]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in table.iterrows():
        cells = [str(r["config"]), str(r["n_seeds"]), str(r["rounds"])]
        for p in prefixes:
            for what in MD_COLUMNS:
                cells.append(_pm(r[f"{p}_{what}_mean"], r[f"{p}_{what}_std"]))
        for p in prefixes:
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

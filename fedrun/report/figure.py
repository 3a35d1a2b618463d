"""summary.png: mean accuracy curves over seeds (+- std), one panel per model, one line per configuration."""
from __future__ import annotations

from .jobs import MODEL_NAMES, PREFIXES, Group
from .stats import mean_curve


def summary_figure(groups: list[Group], path: str) -> None:
    from ..plots import plot_curve_panels

    panels = []
    for p in PREFIXES:
        curves = {g.label: mean_curve(g.jobs, f"{p}_acc") for g in groups}
        curves = {k: v for k, v in curves.items() if len(v)}
        if curves:
            panels.append((f"{MODEL_NAMES[p]} accuracy", curves))
    plot_curve_panels(panels, path, ylabel="test accuracy (pooled over clients)", suptitle="mean over seeds, band: ± std")

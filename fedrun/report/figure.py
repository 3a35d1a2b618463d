"""summary.png: mean accuracy curves over seeds (+- std), one panel per model, one line per configuration."""
from __future__ import annotations

from .jobs import MODEL_NAMES, PREFIXES, Group, _short
from .stats import mean_curve


def short_labels(groups: list[Group]) -> tuple[dict[str, str], str | None]:
    """The legend of a sweep's figure: each configuration by the values of the options that vary
    (`fedavg, 10`), and the options' names as the legend's title (`algo, tau`). Labels that the values
    alone would not tell apart (an option only some configurations have) keep their `key=value`."""
    options = list(dict.fromkeys(o for g in groups for o in g.settings))
    short = {g.label: ", ".join(_short(g.settings[o]) for o in options if o in g.settings) or g.label for g in groups}
    if len(set(short.values())) < len(short) or not options or any(set(g.settings) != set(options) for g in groups):
        return {g.label: g.label for g in groups}, None
    return short, ", ".join(options)


def summary_figure(groups: list[Group], path: str) -> None:
    """Writes the figure to `path` (its extension: png, pdf or svg)."""
    from ..plots import plot_curve_panels

    names, title = short_labels(groups)
    panels = []
    for p in PREFIXES:
        curves = {names[g.label]: mean_curve(g.jobs, f"{p}_acc") for g in groups}
        panels.append((f"{MODEL_NAMES[p]} accuracy", {k: v for k, v in curves.items() if len(v)}))
    plot_curve_panels(panels, path, ylabel="test accuracy (pooled over clients)", suptitle="mean over seeds, band: ± std",
                      sharey=False, fit_y=True, legend_title=title)

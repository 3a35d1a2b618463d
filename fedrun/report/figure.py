"""summary.png: mean accuracy curves over seeds (+- std), one panel per model, one line per configuration."""
from __future__ import annotations

from .jobs import GROUPS, MODEL_NAMES, PREFIXES, Group, _short
from .stats import mean_curve


def _owner(option: str) -> str | None:
    """The config group an option belongs to (`algo.lr` -> algo), None for a top-level option."""
    head, dot, _ = option.partition(".")
    return head if dot and head in GROUPS else None


def short_labels(groups: list[Group]) -> tuple[dict[str, str], str | None]:
    """The legend of a sweep's figure, and its title.

    A sweep of one method's options (or of options every configuration has, none of them a
    method's own while the method varies): each configuration by the values of the options that
    vary (`0.01, 10`), their names as the legend's title, after the shared method's name
    (`pfedme: algo.lr, tau`). Otherwise each configuration by its method's name and the options
    that tell it apart (`fedprox, mu=0.1`): a group's own option (algo.mu, partition.alpha) only
    where it differs between configurations of the same choice of that group (a method's defaults
    are not a difference), the `algo.` left out after the method's name. Labels that would not
    tell the configurations apart keep their `key=value` form (Group.label)."""
    full = {g.label: g.jobs[0].settings for g in groups}
    options = list(dict.fromkeys(o for g in groups for o in g.settings))
    algos = {full[g.label].get("algo") for g in groups}
    compact = options and all(set(g.settings) == set(options) for g in groups) \
        and not ("algo" in options and any(_owner(o) for o in options))
    if compact:
        short = {g.label: ", ".join(_short(g.settings[o]) for o in options) for g in groups}
        if len(set(short.values())) == len(short):
            method = f"{algos.pop()}: " if len(algos) == 1 and None not in algos else ""
            return short, method + ", ".join(options)
    missing = object()
    names = {}
    options.sort(key=lambda o: _owner(o) != "algo")  # the method's own options right after its name
    for g in groups:
        mine = full[g.label]
        parts = [str(mine["algo"])] if "algo" in mine else []
        for o in options:
            if o == "algo" or o not in mine:
                continue
            owner = _owner(o)
            if owner is not None:  # shown where the configurations of this choice of its group differ in it
                peers = [full[h.label] for h in groups if full[h.label].get(owner) == mine.get(owner)]
                if len({repr(p.get(o, missing)) for p in peers}) < 2:
                    continue
            name = o[len("algo."):] if owner == "algo" and parts else o
            parts.append(f"{name}={_short(mine[o])}")
        names[g.label] = ", ".join(parts) or g.label
    if len(set(names.values())) < len(names):
        return {g.label: g.label for g in groups}, None
    return names, None


def summary_figure(groups: list[Group], path: str) -> None:
    """Writes the figure to `path` (its extension: png, pdf or svg)."""
    from ..plots import plot_curve_panels

    names, title = short_labels(groups)
    panels = []
    for p in PREFIXES:
        curves = {names[g.label]: mean_curve(g.jobs, f"{p}_acc") for g in groups}
        panels.append((f"{MODEL_NAMES[p]} accuracy", {k: v for k, v in curves.items() if len(v)}))
    plot_curve_panels(panels, path, ylabel="test accuracy (pooled over clients)",
                      suptitle="mean over seeds, band: ± std",
                      sharey=False, fit_y=True, legend_title=title)

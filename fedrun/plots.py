"""Figures drawn from a run's metrics.csv (never from retraining)."""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

COLORS = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442", "#882255",
          "#999933")  # Okabe-Ito's colour-blind-safe eight, then two of Tol's: ten hues
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
DASHES = ("-", "--", ":", "-.")


def line_style(i: int) -> dict:
    """Matplotlib keywords of the i-th line of a figure: no two of the first 100 lines share their
    colour and their marker (line i: colour i mod 10, marker (i + i div 10) mod 10), and each block
    of ten lines has its own dash; so 20+ configurations stay apart, in grey print too."""
    return {"color": COLORS[i % 10], "marker": MARKERS[(i + i // 10) % 10], "linestyle": DASHES[(i // 10) % 4]}


def fit_ylim(ax, values, head: float = 0.2, pad: float = 0.05, spreads=None) -> tuple[float, float] | None:
    """The y-axis fitted to the curves: from the lowest value any of them takes after its first
    `head` of the points (the climb from the initial model, which would squeeze the rest into a
    sliver, is cut) to the highest value of all, plus `pad` of that range on each side. `values`:
    one sequence per curve; `spreads`: each curve's +- band (its std, NaN where none), which the
    axis then holds too, on the same points. Returns the limits set (None: no finite value)."""
    import numpy as np

    lows, highs = [], []
    for i, v in enumerate(values):
        v = np.asarray(pd.to_numeric(pd.Series(v), errors="coerce"), dtype=float)
        s = np.zeros_like(v) if spreads is None else np.nan_to_num(
            np.asarray(pd.to_numeric(pd.Series(spreads[i]), errors="coerce"), dtype=float), nan=0.0)
        keep = np.isfinite(v)
        v, s = v[keep], s[keep]
        if len(v):
            start = int(len(v) * head) if len(v) > 1 else 0
            lows.append((v - s)[start:].min())
            highs.append((v + s).max())
    if not lows:
        return None
    lo, hi = min(lows), max(highs)
    span = (hi - lo) or max(abs(hi), 1e-3) * 0.1
    ax.set_ylim(lo - pad * span, hi + pad * span)
    return ax.get_ylim()


def save_figure(fig, out_path: str, title: str = "") -> None:
    """Titles, lays out and writes `fig` atomically (temp file + rename), then closes it; the file
    type is `out_path`'s extension (png, pdf or svg)."""
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    ext = os.path.splitext(out_path)[1]
    tmp = out_path + ".tmp" + ext
    fig.savefig(tmp, dpi=110, bbox_inches="tight")  # "tight": a legend placed below the panels is kept
    plt.close(fig)
    os.replace(tmp, out_path)


UNSEEN = "unseen clients"  # the held-out clients (`partition.holdout`): metrics.csv's new_* columns


def plot_run(metrics_csv: str, out_png: str, title: str = "", personalized: str = "personalized models") -> None:
    """Accuracy and loss against rounds for the global and personalized models (`personalized`: how
    the run's algorithm personalizes, for the legend), and for the unseen (held-out) clients where
    metrics.csv has them (`new_global_*`, `new_pers_*`).

    Accuracy: the pooled accuracy, a band over the middle half of the clients (their accuracies'
    inter-quartile range, metrics.csv `<m>_acc_p25`..`<m>_acc_p75`) and a dotted line under which
    the lowest tenth of the clients lie (`<m>_acc_p10`); a metrics.csv from before those columns
    gets the lowest client's line instead. The unseen clients' pooled accuracy is a dash-dot line in
    a colour of its own, without the band (four overlapping bands hide each other). Legend: a
    column per model, its unseen clients' line below it. Loss: each test loss as a wide line, the
    train loss as a thin dashed line over them, so that neither hides the other where they coincide."""
    from matplotlib.ticker import MaxNLocator

    df = pd.read_csv(metrics_csv)
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 4.8))
    x = df["round"]
    columns = []  # the accuracy legend's columns: a model's entries, then its unseen clients'
    for i, (prefix, label) in enumerate((("global", "global model"), ("pers", personalized))):
        if f"{prefix}_acc" not in df:
            continue
        color = COLORS[i]
        column = [ax_acc.plot(x, df[f"{prefix}_acc"], label=f"{label} (pooled)", linewidth=1.6, color=color)[0]]
        if f"{prefix}_acc_p25" in df:
            column.append(ax_acc.fill_between(x, df[f"{prefix}_acc_p25"], df[f"{prefix}_acc_p75"], color=color,
                                              alpha=0.18, linewidth=0, label="middle half of its clients (p25-p75)"))
            column += ax_acc.plot(x, df[f"{prefix}_acc_p10"], linestyle=":", linewidth=1.2, color=color,
                                  label="lowest tenth of its clients below (p10)")
        else:  # a metrics.csv from before the quantile columns
            column += ax_acc.plot(x, df[f"{prefix}_acc_min"], linestyle=":", linewidth=1, color=color,
                                  label="its lowest client")
        ax_loss.plot(x, df[f"{prefix}_loss"], label=f"test loss, {label}", linewidth=2.6, alpha=0.75, color=color,
                     zorder=2)
        if f"new_{prefix}_acc" in df and pd.to_numeric(df[f"new_{prefix}_acc"], errors="coerce").notna().any():
            unseen = COLORS[i + 2]
            column += ax_acc.plot(x, df[f"new_{prefix}_acc"], label=f"{UNSEEN}, {label} (pooled)", linewidth=1.6,
                                  linestyle="-.", color=unseen, marker=MARKERS[i + 2], markersize=4,
                                  markevery=max(1, len(x) // 8))
            ax_loss.plot(x, df[f"new_{prefix}_loss"], label=f"test loss, {UNSEEN}, {label}", linewidth=1.8,
                         linestyle="-.", color=unseen, zorder=2)
        columns.append(column)
    ax_loss.plot(x, df["train_loss"], label="train loss, global model", linestyle=(0, (4, 3)), linewidth=1.1,
                 color="black", zorder=3)
    ax_acc.set(xlabel="round", ylabel="test accuracy", title="accuracy")
    ax_loss.set(xlabel="round", ylabel="loss", title="loss")
    # below the panel, clear of the curves and of the round axis' label
    below = {"fontsize": 7.5, "loc": "upper center", "bbox_to_anchor": (0.5, -0.16), "frameon": False}
    rows = max(map(len, columns), default=0)
    handles = [h for column in columns for h in column + [_blank()] * (rows - len(column))]  # filled column-wise
    ax_acc.legend(handles, [h.get_label() for h in handles], ncol=max(1, len(columns)), **below)
    ax_loss.legend(**below)
    for ax in (ax_acc, ax_loss):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
        ax.grid(alpha=0.3)
    save_figure(fig, out_png, title)


def _blank():
    """An empty legend entry (it keeps a shorter legend column's rows beside the longer one's)."""
    from matplotlib.patches import Rectangle

    return Rectangle((0, 0), 0, 0, fill=False, edgecolor="none", label=" ")


def once_label(label: str) -> str:
    """The legend entry of a configuration evaluated at one round only (drawn as a marker with its
    +- std bar: a line needs two points)."""
    return f"{label} (evaluated once)"


def plot_curve_panels(panels, out_png: str, xlabel: str = "round", ylabel: str = "test accuracy",
                      suptitle: str = "", styles: dict | None = None, ncols: int | None = None, x: str = "round",
                      hlines: dict | None = None, sharey: bool = True, fit_y: bool = False,
                      legend_title: str | None = None) -> None:
    """One panel per (title, {label: curve}); a curve is a DataFrame with columns `x` (default round),
    mean, std.

    Each curve is drawn as its mean with a +- std band (no band where std is NaN, e.g. one seed); a
    curve with one number (a configuration evaluated once) as a marker with a +- std bar, its label
    followed by `once_label`'s "(evaluated once)"; a curve without a number, and a panel without a
    curve, is left out. A label keeps its colour, marker and dash (`line_style`) in every panel.
    `styles` maps a label to the matplotlib keyword arguments it is drawn with instead (color,
    linestyle, ...); `hlines` maps a panel title to (y, label) of a dashed horizontal line (e.g. a
    target accuracy); `fit_y`: each panel's y-axis fitted to its curves and their bands
    (`fit_ylim`); `legend_title` heads the legend (e.g. the swept options, when the labels are
    their values).
    """
    panels = [(title, {k: c for k, c in curves.items() if pd.to_numeric(c["mean"], errors="coerce").notna().any()})
              for title, curves in panels]
    panels = [(title, curves) for title, curves in panels if curves]
    order = list(dict.fromkeys(label for _, curves in panels for label in curves))
    n = max(1, len(panels))
    ncols = ncols or (n if n <= 3 else 2 if n == 4 else 3)
    nrows = (n + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.9 * nrows), squeeze=False, sharey=sharey)
    for ax, (title, curves) in zip(axes.flat, panels):
        for label, c in curves.items():
            if styles and label in styles:
                kw = dict(styles[label])
            else:  # markers at about 8 points of each curve, offset per line so that they do not pile up
                step = max(1, len(c[x]) // 8)
                kw = {**line_style(order.index(label)), "markevery": (order.index(label) % step, step), "markersize": 4}
            mean = pd.to_numeric(c["mean"], errors="coerce")
            std = pd.to_numeric(c["std"], errors="coerce")
            if mean.notna().sum() == 1:  # one evaluation: a marker with its +- std bar, said in the legend
                at = mean.notna().to_numpy()
                kw = {k: v for k, v in kw.items() if k not in ("markevery", "markersize", "linestyle")}
                ax.errorbar(c[x][at], mean[at], yerr=std[at].fillna(0).to_numpy(), label=once_label(label),
                            markersize=8, capsize=5, elinewidth=1.5, linestyle="none", **kw)
                continue
            line, = ax.plot(c[x], mean, label=label, linewidth=1.3, **kw)
            if std.notna().any():
                ax.fill_between(c[x], mean - std, mean + std, color=line.get_color(),
                                alpha=0.18 if len(curves) <= 6 else 0.06, linewidth=0)  # many lines: fainter bands
        if hlines and title in hlines:
            y, name = hlines[title]
            ax.axhline(y, color="gray", linestyle=":", linewidth=1, label=name)
        if fit_y:
            fit_ylim(ax, [c["mean"] for c in curves.values()], spreads=[c["std"] for c in curves.values()])
        ax.set(title=title, xlabel=xlabel)
        if x == "round":
            from matplotlib.ticker import MaxNLocator

            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no fractional rounds
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    # one legend for all panels, below them: clear of every curve and of the axis labels
    legend: dict = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    rank = {label: i for i, label in enumerate(order)} | {once_label(label): i for i, label in enumerate(order)}
    legend = dict(sorted(legend.items(), key=lambda kv: rank.get(kv[0], len(order))))  # the curves' order
    fig.tight_layout()
    if legend:
        fig.legend(legend.values(), legend.keys(), loc="upper center", bbox_to_anchor=(0.5, 0), fontsize=8,
                   ncol=min(len(legend), 4 if len(legend) > 9 else 3), frameon=False, title=legend_title,
                   title_fontsize=8)
    save_figure(fig, out_png, suptitle)


def plot_partition(counts, num_holdout: int, out_png: str, title: str = "") -> None:
    """partition.png: clients (x) by labels (y), a dot per (client, label) sized by its training rows;
    held-out clients (the last `num_holdout`) drawn in red behind a shaded band.

    Args:
        counts: [clients, labels] training rows per label (array-like).
    """
    import numpy as np

    counts = np.asarray(counts, dtype=np.float64)
    c, k = counts.shape
    cc, kk = np.nonzero(counts)
    size = 150.0 * counts[cc, kk] / max(counts.max(), 1.0)
    held = cc >= c - num_holdout
    fig, ax = plt.subplots(figsize=(min(4 + c * 0.12, 16), min(2.5 + k * 0.18, 10)))
    ax.scatter(cc[~held], kk[~held], s=size[~held], c="tab:blue", linewidths=0, label="training clients")
    if num_holdout:
        ax.axvspan(c - num_holdout - 0.5, c - 0.5, color="tab:red", alpha=0.08)
        ax.scatter(cc[held], kk[held], s=size[held], c="tab:red", linewidths=0, label=f"held out ({num_holdout})")
        ax.legend(loc="upper right", fontsize=8, markerscale=0.6)
    ax.set_xlabel("client")
    ax.set_ylabel("label")
    ax.set_xlim(-0.5, c - 0.5)
    ax.set_ylim(-0.5, k - 0.5)
    save_figure(fig, out_png, title or f"{c} clients x {k} labels, dot area = training rows")

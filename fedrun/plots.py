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


def fit_ylim(ax, values, head: float = 0.2, pad: float = 0.05) -> None:
    """The y-axis fitted to the curves: from the lowest value any of them takes after its first
    `head` of the points (the climb from the initial model, which would squeeze the rest into a
    sliver, is cut) to the highest value of all, plus `pad` of that range on each side. `values`:
    one sequence per curve."""
    import numpy as np

    lows, highs = [], []
    for v in values:
        v = np.asarray(pd.to_numeric(pd.Series(v), errors="coerce"), dtype=float)
        v = v[np.isfinite(v)]
        if len(v):
            lows.append(v[int(len(v) * head):].min() if len(v) > 1 else v.min())
            highs.append(v.max())
    if not lows:
        return
    lo, hi = min(lows), max(highs)
    span = (hi - lo) or max(abs(hi), 1e-3) * 0.1
    ax.set_ylim(lo - pad * span, hi + pad * span)


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


def plot_run(metrics_csv: str, out_png: str, title: str = "", personalized: str = "personalized models") -> None:
    """Accuracy and loss against rounds for the global and personalized models (`personalized`: how
    the run's algorithm personalizes, for the legend).

    Accuracy: the pooled accuracy, a band over the middle half of the clients (their accuracies'
    inter-quartile range, metrics.csv `<m>_acc_p25`..`<m>_acc_p75`) and a dotted line under which
    the lowest tenth of the clients lie (`<m>_acc_p10`); a metrics.csv from before those columns
    gets the lowest client's line instead. Loss: each test loss as a wide line, the train loss as a
    thin dashed line over them, so that neither hides the other where they coincide."""
    from matplotlib.ticker import MaxNLocator

    df = pd.read_csv(metrics_csv)
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 4.8))
    x = df["round"]
    for prefix, label in (("global", "global model"), ("pers", personalized)):
        if f"{prefix}_acc" not in df:
            continue
        line, = ax_acc.plot(x, df[f"{prefix}_acc"], label=f"{label} (pooled)", linewidth=1.6)
        color = line.get_color()
        if f"{prefix}_acc_p25" in df:
            ax_acc.fill_between(x, df[f"{prefix}_acc_p25"], df[f"{prefix}_acc_p75"], color=color, alpha=0.18,
                                linewidth=0, label="middle half of its clients (p25-p75)")
            ax_acc.plot(x, df[f"{prefix}_acc_p10"], linestyle=":", linewidth=1.2, color=color,
                        label="lowest tenth of its clients below (p10)")
        else:  # a metrics.csv from before the quantile columns
            ax_acc.plot(x, df[f"{prefix}_acc_min"], linestyle=":", linewidth=1, color=color,
                        label="its lowest client")
        ax_loss.plot(x, df[f"{prefix}_loss"], label=f"test loss, {label}", linewidth=2.6, alpha=0.75, color=color,
                     zorder=2)
    ax_loss.plot(x, df["train_loss"], label="train loss, global model", linestyle=(0, (4, 3)), linewidth=1.1,
                 color="black", zorder=3)
    ax_acc.set(xlabel="round", ylabel="test accuracy", title="accuracy")
    ax_loss.set(xlabel="round", ylabel="loss", title="loss")
    for ax in (ax_acc, ax_loss):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
        ax.grid(alpha=0.3)
        # below the panel, clear of the curves and of the round axis' label
        ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False,
                  ncol=2 if ax is ax_acc and "pers_acc" in df else 1)  # acc: a column per model
    save_figure(fig, out_png, title)


def plot_curve_panels(panels, out_png: str, xlabel: str = "round", ylabel: str = "test accuracy",
                      suptitle: str = "", styles: dict | None = None, ncols: int | None = None, x: str = "round",
                      hlines: dict | None = None, sharey: bool = True, fit_y: bool = False,
                      legend_title: str | None = None) -> None:
    """One panel per (title, {label: curve}); a curve is a DataFrame with columns `x` (default round),
    mean, std.

    Each curve is drawn as its mean with a +- std band (no band where std is NaN, e.g. one seed);
    a curve without a number, and a panel without a curve, is left out. A label keeps its colour,
    marker and dash (`line_style`) in every panel. `styles` maps a label to the matplotlib keyword
    arguments it is drawn with instead (color, linestyle, ...); `hlines` maps a panel title to (y, label)
    of a dashed horizontal line (e.g. a target accuracy); `fit_y`: each panel's y-axis fitted to its
    curves (`fit_ylim`); `legend_title` heads the legend (e.g. the swept options, when the labels
    are their values).
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
            line, = ax.plot(c[x], c["mean"], label=label, linewidth=1.3, **kw)
            std = pd.to_numeric(c["std"], errors="coerce")
            if std.notna().any():
                ax.fill_between(c[x], c["mean"] - std, c["mean"] + std, color=line.get_color(),
                                alpha=0.18 if len(curves) <= 6 else 0.06, linewidth=0)  # many lines: fainter bands
        if hlines and title in hlines:
            y, name = hlines[title]
            ax.axhline(y, color="gray", linestyle=":", linewidth=1, label=name)
        if fit_y:
            fit_ylim(ax, [c["mean"] for c in curves.values()])
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

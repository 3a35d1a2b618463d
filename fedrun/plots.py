"""Figures drawn from a run's metrics.csv (never from retraining)."""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def plot_run(metrics_csv: str, out_png: str, title: str = "") -> None:
    """Accuracy and loss against rounds for the global and personalized models."""
    df = pd.read_csv(metrics_csv)
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 4))
    for prefix, label in (("global", "global model"), ("pers", "personalized (1 step on own train data)")):
        if f"{prefix}_acc" in df:
            ax_acc.plot(df["round"], df[f"{prefix}_acc"], label=label)
            ax_acc.fill_between(df["round"], df[f"{prefix}_acc_min"], df[f"{prefix}_acc_max"], alpha=0.12)
            ax_loss.plot(df["round"], df[f"{prefix}_loss"], label=f"test loss, {label}")
    ax_loss.plot(df["round"], df["train_loss"], label="train loss, global model", linestyle="--")
    ax_acc.set(xlabel="round", ylabel="test accuracy (pooled over all clients)", title="accuracy (band: min-max client)")
    ax_loss.set(xlabel="round", ylabel="loss", title="loss")
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    tmp = out_png + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, out_png)

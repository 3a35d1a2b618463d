"""`fedrun-data [overrides]`: builds a run's data exactly as `fedrun` would (same configs, same
overrides, same cache), trains nothing, and prints per-client sizes and label statistics; writes
partition.csv and partition.png into `--out` (default ./partition).

    fedrun-data dataset=cifar100 partition=dirichlet partition.alpha=0.1 partition.num_clients=1000
    fedrun-data data=mnist_pfedme
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np


def stats_table(counts: np.ndarray, test_sizes: np.ndarray, num_holdout: int) -> list[str]:
    """One line per client: rows, labels present, its largest label's share, held out or not."""
    c = len(counts)
    n = counts.sum(1)
    lines = [f"{'client':>6} {'n_train':>7} {'n_test':>6} {'labels':>6} {'top_label':>9} {'top_share':>9} heldout"]
    for i in range(c):
        top = int(counts[i].argmax())
        lines.append(f"{i:>6} {int(n[i]):>7} {int(test_sizes[i]):>6} {int((counts[i] > 0).sum()):>6} {top:>9} "
                     f"{counts[i, top] / max(n[i], 1):>9.3f} {'yes' if i >= c - num_holdout else ''}")
    return lines


def summary_lines(counts: np.ndarray, test_sizes: np.ndarray, num_holdout: int) -> list[str]:
    n = counts.sum(1)
    labels = (counts > 0).sum(1)
    q = lambda v: f"min {v.min():g}, median {np.median(v):g}, mean {v.mean():.1f}, max {v.max():g}"
    return [f"clients: {len(counts)} ({num_holdout} held out), labels: {counts.shape[1]}, "
            f"training rows: {int(n.sum())}, test rows: {int(test_sizes.sum())}",
            f"training rows per client: {q(n)}",
            f"labels per client: {q(labels)}",
            f"largest label's share per client: {q(counts.max(1) / np.maximum(n, 1))}"]


def main(argv: list[str] | None = None) -> None:
    from hydra import compose, initialize_config_dir

    from .args import ArgumentParser
    from .config import CONF_DIR, instantiate_checked, with_env_searchpath
    from .errors import ConfigError, DataMissingError
    from .outputs import cannot_write, write_partition
    from .plots import plot_partition
    from .run.checks import job_problems, precheck

    ap = ArgumentParser(prog="fedrun-data", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="partition",
                    help="folder for partition.csv and partition.png (default ./partition)")
    ap.add_argument("--clients", type=int, default=50,
                    help="print at most this many clients' lines (default 50; 0: none)")
    ap.add_argument("overrides", nargs="*", help="fedrun's overrides, e.g. dataset=mnist partition=shards")
    args = ap.parse_args(argv)
    if args.clients < 0:
        ap.refuse("--clients", args.clients, "must be at least 0 (0: no client lines)")
    overrides = with_env_searchpath(args.overrides)
    problem = precheck(overrides)
    if problem:
        print(f"fedrun-data: error: {problem}", file=sys.stderr)
        sys.exit(2)
    t0 = time.perf_counter()
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("config", overrides=overrides)
        problems = job_problems(cfg)  # the options it does not use checked as fedrun checks them: a command
        if problems:                  # fedrun-data takes is one fedrun takes
            raise ConfigError(problems[0])
        data = instantiate_checked(cfg.data)
    except (ConfigError, DataMissingError) as e:
        print(f"fedrun-data: error: {str(e).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)
    seconds = time.perf_counter() - t0
    counts = data.train.label_counts(data.num_classes).numpy()
    test_sizes = data.test.sizes.numpy()
    held = int(data.num_holdout)
    try:
        os.makedirs(args.out, exist_ok=True)
        write_partition(data, os.path.join(args.out, "partition.csv"))
        plot_partition(counts, held, os.path.join(args.out, "partition.png"))
    except OSError as e:  # a read-only or full disk, a file named as the folder
        print(f"fedrun-data: error: --out {args.out}: {cannot_write(e, 'name a writable folder')}", file=sys.stderr)
        sys.exit(2)
    shown = stats_table(counts, test_sizes, held)
    if args.clients and len(counts) > args.clients:
        shown = shown[: args.clients + 1] + [f"... {len(counts) - args.clients} more in partition.csv"]
    for line in [f"{data.name}: built in {seconds:.2f}s", *summary_lines(counts, test_sizes, held),
                 *(shown if args.clients else [])]:
        print(line)
    print(f"fedrun-data: wrote {os.path.join(args.out, 'partition.csv')} and partition.png")


if __name__ == "__main__":
    main()

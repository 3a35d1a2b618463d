#!/usr/bin/env python
"""Figure 1 of Per-FedAvg (Fallah, Mokhtari, Ozdaglar 2020; papers 000/001, Section 5), end to end.

FedAvg, "FedAvg + update" (FedAvg's model after one gradient step of lr alpha on each user's own
data: fedrun's `pers_acc` of FedAvg) and Per-FedAvg (first-order, as in the paper's experiment, its
model likewise adapted by one step) on the MNIST 0-4/5-9 split: n=10 users, MLP 80-60 ELU,
alpha=0.01, beta=0.001, batch D=D'=50, K=1000 rounds, one panel per (tau, r): tau local steps,
r*n users per round. The paper does not state `a` for this figure; fedrun's data default is used
(conf/data/mnist_perfedavg.yaml), lowered if the MNIST at hand is too small.

    python scripts/perfedavg_figure1.py --dataset.root /path/to/data          # full: 1000 rounds
    python scripts/perfedavg_figure1.py --quick --dataset.root ...            # 3 rounds (smoke test)
    python scripts/perfedavg_figure1.py --replot outputs/papers/perfedavg_figure1/<run>   # redraw only

Runs `fedrun -m` once per (tau, r) (both algorithms x the seeds), then draws everything from the
runs' metrics.csv: figure1.png, figure1.csv / .md (final and best accuracy per panel) and the
sweep report (summary.csv / .md / .png, jobs.csv) in the output folder it prints.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _paper  # noqa: E402

NAME = "perfedavg_figure1"
PAPER = dict(n=10, alpha=0.01, beta=0.001, batch_size=50, rounds=1000)
CURVES = [  # label, algorithm, column
    ("FedAvg", "fedavg", "global_acc"),
    ("FedAvg + update", "fedavg", "pers_acc"),
    ("Per-FedAvg (FO)", "perfedavg", "pers_acc"),
]
STYLES = {"FedAvg": dict(color="tab:blue", linestyle="--"), "FedAvg + update": dict(color="tab:orange"),
          "Per-FedAvg (FO)": dict(color="tab:green")}


def parse_pairs(text: str) -> list[tuple[int, float]]:
    pairs = []
    for item in text.split(","):
        try:
            tau, r = item.split(":")
            pairs.append((int(tau), float(r)))
        except ValueError:
            _paper.fail(f"--pairs item {item!r} must be tau:r, e.g. 10:0.2")
    return pairs


def pair_dir(runs: str, tau: int, r: float) -> str:
    return os.path.join(runs, f"tau{tau}_r{r:g}")


def default_a() -> int:
    from omegaconf import OmegaConf

    from fedrun.config import CONF_DIR

    return int(OmegaConf.load(os.path.join(CONF_DIR, "data", "mnist_perfedavg.yaml")).a)


def train(args, out: str, pairs, seeds, rounds: int) -> None:
    tr, te = _paper.mnist_labels(args.data_root, download=not args.no_download)
    _paper.describe_data(args.data_root, tr, te)
    a = _paper.fitting_a(tr, te, PAPER["n"], args.a or default_a())
    print(f"settings: n={PAPER['n']}, a={a}, alpha={PAPER['alpha']}, beta={PAPER['beta']}, "
          f"batch {PAPER['batch_size']}, {rounds} rounds, (tau, r) in {pairs}, seeds {seeds}")
    hidden = [k for k in _paper.HIDDEN_IN_NAMES if k != "algo"] + ["tau", "frac", "algo.alpha", "algo.beta"]
    total = 0.0
    for tau, r in pairs:
        total += _paper.run_sweep(args, pair_dir(os.path.join(out, "runs"), tau, r), [
            "algo=fedavg,perfedavg", "data=mnist_perfedavg", "model=mlp",
            f"dataset.root={os.path.abspath(args.data_root)}", "data.download=false", f"data.n={PAPER['n']}",
            f"data.a={a}", f"tau={tau}", f"frac={r}", f"batch_size={PAPER['batch_size']}", f"rounds={rounds}",
            f"algo.alpha={PAPER['alpha']}", f"algo.beta={PAPER['beta']}",
            f"seed={','.join(map(str, seeds))}", f"device={args.device}", "on_diverge=record",
        ], hidden)
    print(f"training took {total:.0f}s")


def draw(out: str, pairs) -> list[dict]:
    from fedrun import report
    from fedrun.outputs import write_atomic, write_csv
    from fedrun.plots import plot_curve_panels

    panels, rows = [], []
    for tau, r in pairs:
        d = pair_dir(os.path.join(out, "runs"), tau, r)
        if not os.path.isdir(d):
            sys.exit(f"error: no runs for tau={tau}, r={r:g} in {d}")
        jobs, groups, _ = report.build([d])
        by_algo = {g.jobs[0].settings.get("algo"): g for g in groups}
        for j in jobs:
            if not j.ok:
                print(f"warning: left out {j.path}: {j.status}")
        curves = {}
        for label, algo, col in CURVES:
            g = by_algo.get(algo)
            if g is None:
                print(f"warning: tau={tau}, r={r:g}: no finished {algo} run")
                continue
            if algo == "perfedavg" and g.jobs[0].settings.get("algo.variant") != "fo":
                label = f"Per-FedAvg ({g.jobs[0].settings.get('algo.variant')})"
            c = report.mean_curve(g.jobs, col)
            curves[label] = c
            vals = [report.job_values(j, []) for j in g.jobs]
            key = col.replace("_acc", "")
            last = [v[f"{key}_acc_last_round"] for v in vals]
            best = [v[f"{key}_acc_best_round"] for v in vals]
            rows.append({"tau": tau, "r": r, "curve": label, "seeds": len(g.jobs), "rounds": int(c["round"].iloc[-1]),
                         "acc_last_round_mean": _mean(last), "acc_last_round_std": _paper.sample_std(last),
                         "acc_best_round_mean": _mean(best), "acc_best_round_std": _paper.sample_std(best)})
        users = max(1, round(r * PAPER["n"]))
        panels.append((f"τ={tau}, r={r:g} ({users} of {PAPER['n']} users per round)", curves))
    if not rows:
        sys.exit("error: no finished runs to draw")
    png = os.path.join(out, "figure1.png")
    rounds, n_seeds = max(x["rounds"] for x in rows), max(x["seeds"] for x in rows)
    seeds = "one seed" if n_seeds == 1 else f"mean over {n_seeds} seeds, band ± std"
    plot_curve_panels(panels, png, ylabel="test accuracy (pooled over users)", styles=STYLES,
                      suptitle=f"Per-FedAvg Figure 1 (fedrun): MNIST 0-4/5-9 split, {rounds} rounds, {seeds}")
    write_csv(os.path.join(out, "figure1.csv"), rows)
    lines = ["| tau | r | curve | last-round accuracy % | best-round accuracy % | seeds |", "|---|---|---|---|---|---|"]
    for x in rows:
        lines.append(f"| {x['tau']} | {x['r']:g} | {x['curve']} | "
                     f"{_pm(x['acc_last_round_mean'], x['acc_last_round_std'])} "
                     f"| {_pm(x['acc_best_round_mean'], x['acc_best_round_std'])} | {x['seeds']} |")
    write_atomic(os.path.join(out, "figure1.md"), "\n".join(lines) + "\n")
    print("\n".join(lines))
    return rows


def _mean(v):
    return sum(v) / len(v)


def _pm(m, s) -> str:
    return _paper.pct(m) + ("" if s != s else f" ± {_paper.pct(s)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    _paper.common_options(ap, NAME)
    ap.add_argument("--pairs", default="10:0.2,4:0.5,10:0.5",
                    help="(tau, r) panels as tau:r,... (default: %(default)s)")
    ap.add_argument("--a", type=int, default=None,
                    help="images per digit of the full users (default: fedrun's data default)")
    args = ap.parse_args(argv)
    t0 = time.time()
    out = _paper.out_dir(args, NAME)
    pairs = parse_pairs(args.pairs)
    rounds = args.rounds or (3 if args.quick else PAPER["rounds"])
    if not args.replot:
        _paper.make_out(out)
        print(f"outputs: {out}")
        train(args, out, pairs, _paper.seeds_of(args), rounds)
    draw(out, pairs)
    from fedrun.report import write_report

    rep = write_report([os.path.join(out, "runs")], out, figure=True, title="Per-FedAvg Figure 1 runs")
    print(f"wrote {os.path.join(out, 'figure1.png')}, figure1.csv, figure1.md and the sweep report "
          f"({', '.join(sorted(rep.files))}) in {out}")
    print(f"done in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

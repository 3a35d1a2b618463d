#!/usr/bin/env python
"""Figures 1-4 of the pFedMe paper (002, Section 5), end to end.

  Figure 1: effect of K (inner steps) on pFedMe, MNIST: K = 1, 5, 7 (|D|=20, lambda=15, R=20, beta=1)
  Figure 2: effect of beta (server mixing) on pFedMe, MNIST: beta = 1, 2, 4 (K=5; beta=4 with eta=0.003)
  Figure 3: pFedMe (PM, GM) vs Per-FedAvg vs FedAvg with the same hyperparameters, MNIST (S=5, T=800)
  Figure 4: the same on Synthetic(0.5, 0.5) (S=10, T=600)

Each figure has the strongly convex (MLR) and the nonconvex (DNN) setting side by side: test
accuracy above, training loss below. The settings are the paper's (Section 5.2-5.3, the captions)
and, where the paper is silent, the authors' README commands (CharlieDinh/pFedMe): eta=0.005,
personal lr 0.09 for Figures 1-2, 0.1 (MLR) / 0.09 (DNN) on MNIST and 0.01 on Synthetic for
Figures 3-4, lambda 15 (MNIST) / 20 (Synthetic), Per-FedAvg alpha=0.005, beta=0.001, FedAvg lr
0.005. Everything else (model sizes, R=tau=20, |D|=20, S, T) comes from the presets
conf/experiment/pfedme_<data>_<model>_<algo>.yaml.

    python scripts/pfedme_figures.py --dataset.root /path/to/data                 # all four, paper rounds
    python scripts/pfedme_figures.py --figures 4 --rounds 100                  # Synthetic only, 100 rounds
    python scripts/pfedme_figures.py --models mlr ...                          # the MLR panels only
    python scripts/pfedme_figures.py --protocol official ...                   # the authors' code's choices
    python scripts/pfedme_figures.py --quick                                   # 2 rounds, tiny (smoke test)
    python scripts/pfedme_figures.py --replot outputs/papers/pfedme_figures/<run>   # redraw only

Runs `fedrun -m` once per distinct setting into runs/<setting>/ (a setting two figures share, e.g.
K=5 of Figure 1 and beta=1 of Figure 2, runs once), then draws from the runs' metrics.csv:
figure<N>.png, figures.csv / figures.md (last and best round of every curve and the mean of its last
10 evaluations, the PM gaps the paper quotes for Figures 3-4 beside fedrun's) in the output folder it prints.

The training-loss panels show fedrun's `train_loss`: the GLOBAL model's loss on all clients'
training rows (pFedMe GM, Per-FedAvg's meta model, FedAvg); fedrun records no training loss of the
personalized models, which the paper's loss panels also draw. Curves are not smoothed (the
authors' plots take a moving average over 10-20 rounds). protocol=honest (the default) trains only
the S sampled clients and serves theta as pFedMe's PM; protocol=official is the authors' code (every
client trains every round: 4x (MNIST) / 10x (Synthetic) the local work; see fedrun.run.protocol).
"""
from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _paper  # noqa: E402

NAME = "pfedme_figures"
MODELS = (("mlr", "μ-strongly convex (MLR)"), ("dnn", "nonconvex (DNN)"))
ROUNDS = {"mnist": 800, "synthetic": 600}
PROTOCOLS = ("honest", "official", "official_2020")
MNIST_DATA = ("mnist_pfedme", "mnist_pfedme_authors")
# --quick: 10 synthetic clients of data.seed=9 (3,400 training rows), as scripts/pfedme_table1.py
QUICK_SYNTHETIC = ["data.num_clients=10", "data.seed=9"]


@dataclass(frozen=True)
class Setting:
    """One fedrun configuration (a preset plus the figure's options); its name is its run folder."""
    data: str
    model: str
    algo: str
    options: tuple[tuple[str, float], ...]  # (algo option, value)

    @property
    def name(self) -> str:
        return "_".join([self.data, self.model, self.algo] + [f"{k}{v:g}" for k, v in self.options])

    def overrides(self) -> list[str]:
        return ([f"experiment=pfedme_{self.data}_{self.model}_{self.algo}"]
                + [f"algo.{k}={v:g}" for k, v in self.options])


@dataclass(frozen=True)
class Curve:
    label: str
    setting: Setting
    model: str  # "pers" (pers_acc) or "global" (global_acc, and train_loss)


def pfedme(data: str, model: str, K=5, beta=1.0, eta=0.005, personal_lr=0.09, lam=15) -> Setting:
    return Setting(data, model, "pfedme", (("K", K), ("beta", beta), ("eta", eta), ("personal_lr", personal_lr),
                                           ("lam", lam)))


def both(setting: Setting, what: str) -> list[Curve]:
    """pFedMe's personalized (PM) and global (GM) model of one run."""
    return [Curve(f"pFedMe (PM){what}", setting, "pers"), Curve(f"pFedMe (GM){what}", setting, "global")]


def comparison(data: str, model: str) -> list[Curve]:
    """Figures 3-4: the paper's "same hyperparameters" comparison (authors' README commands)."""
    plr = {"mnist": {"mlr": 0.1, "dnn": 0.09}, "synthetic": {"mlr": 0.01, "dnn": 0.01}}[data][model]
    lam = {"mnist": 15, "synthetic": 20}[data]
    return [*both(pfedme(data, model, personal_lr=plr, lam=lam), ""),
            Curve("Per-FedAvg", Setting(data, model, "perfedavg", (("alpha", 0.005), ("beta", 0.001))), "pers"),
            Curve("FedAvg", Setting(data, model, "fedavg", (("beta", 0.005),)), "global")]


# figure number -> (title, data set, {model: curves}); PM curves first, then GM, as the paper's legends
FIGURES = {
    1: ("Effect of K on pFedMe, MNIST (|D|=20, λ=15, R=20, β=1, η=0.005)", "mnist",
        {m: [c for K in (1, 5, 7) for c in both(pfedme("mnist", m, K=K), f": K = {K}")] for m, _ in MODELS}),
    2: ("Effect of β on pFedMe, MNIST (|D|=20, λ=15, R=20, K=5, η=0.005; β=4: η=0.003)", "mnist",
        {m: [c for b in (1, 2, 4) for c in both(pfedme("mnist", m, beta=b, eta=0.003 if b == 4 else 0.005),
                                                 f": β = {b:.1f}")] for m, _ in MODELS}),
    3: ("pFedMe vs Per-FedAvg vs FedAvg, MNIST (η=0.005, |D|=20, S=5, β=1)", "mnist",
        {m: comparison("mnist", m) for m, _ in MODELS}),
    4: ("pFedMe vs Per-FedAvg vs FedAvg, Synthetic (η=0.005, |D|=20, S=10, β=1)", "synthetic",
        {m: comparison("synthetic", m) for m, _ in MODELS}),
}
# Figures 3-4: the paper's text, "pFedMe's personalized model is x%, y%, z% more accurate than its
# global model, Per-FedAvg and FedAvg" (strongly convex, nonconvex)
PAPER_GAPS = {3: {"mlr": (1.1, 1.3, 1.5), "dnn": (0.9, 0.9, 1.3)}, 4: {"mlr": (6.1, 3.8, 5.2), "dnn": (3.9, 0.7, 3.1)}}
LAST_EVALS = 10  # figures.csv: the mean of the last 10 evaluated rounds besides the last and the best one
COLORS = ["tab:blue", "tab:green", "tab:red", "darkorange", "tab:brown", "m"]


def settings_of(figures: list[int], models: list[str] = ("mlr", "dnn")) -> list[Setting]:
    seen: dict[str, Setting] = {}
    for f in figures:
        for m in models:
            for c in FIGURES[f][2][m]:
                seen.setdefault(c.setting.name, c.setting)
    return list(seen.values())


def train(args, out: str, figures: list[int], models: list[str], seeds: list[int]) -> None:
    settings = settings_of(figures, models)
    if any(s.data == "mnist" for s in settings):
        tr, te = _paper.mnist_labels(args.data_root, download=not args.no_download)
        full = len(tr) == 60000 and len(te) == 10000
        print(f"data: MNIST from {os.path.abspath(args.data_root)}: {len(tr)} + {len(te)} images pooled"
              f"{'' if full else ' (NOT the full 70,000)'}; fedrun data={args.mnist_data}")
    print(f"settings: {len(settings)} runs x {len(seeds)} seeds, protocol={args.protocol}, rounds "
          + ", ".join(f"{d} {args.rounds or (2 if args.quick else ROUNDS[d])}"
                      for d in sorted({s.data for s in settings})))
    total = 0.0
    for s in settings:
        extra = [f"rounds={args.rounds or (2 if args.quick else ROUNDS[s.data])}"]
        if s.data == "mnist":
            extra += [f"data={args.mnist_data}", f"dataset.root={os.path.abspath(args.data_root)}",
                      "data.download=false"]
        elif args.quick:
            extra += QUICK_SYNTHETIC
        ov = s.overrides() + extra + [f"protocol={args.protocol}", f"seed={','.join(map(str, seeds))}",
                                      f"device={args.device}", "on_diverge=record"]
        hidden = sorted({o.split("=", 1)[0] for o in ov} | {"progress", "plot"})  # runs/<name>/<num>_ : seeds only
        total += _paper.run_sweep(args, os.path.join(out, "runs", s.name), ov, hidden)
    print(f"training took {total:.0f}s")


def load(out: str, figures: list[int], models: list[str]) -> dict:
    """Setting name -> its finished jobs (fedrun.report), read from runs/<name>/."""
    from fedrun import report

    found = {}
    for s in settings_of(figures, models):
        d = os.path.join(out, "runs", s.name)
        if not os.path.isdir(d):
            print(f"warning: no runs for {s.name} in {d}")
            continue
        jobs, _, _ = report.build([d])
        for j in jobs:
            if not j.ok:
                print(f"warning: left out {j.path}: {j.status}")
        if any(j.ok for j in jobs):
            found[s.name] = [j for j in jobs if j.ok]
    return found


def draw(out: str, figures: list[int], models: list[str], found: dict) -> list[dict]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedrun.outputs import write_atomic, write_csv
    from fedrun.plots import save_figure
    from fedrun.report import mean_curve

    rows = []
    for f in figures:
        title, data, by_model = FIGURES[f]
        shown = [(m, t) for m, t in MODELS if m in models]
        fig, axes = plt.subplots(2, len(shown), figsize=(5.4 * len(shown), 7.6), squeeze=False)
        ran_as: set = set()  # (protocol, fedrun data=) of the runs drawn: the title says how they ran
        for col, (m, model_title) in enumerate(shown):
            acc_ax, loss_ax = axes[0, col], axes[1, col]
            colors = {}
            for c in by_model[m]:
                jobs = found.get(c.setting.name)
                if not jobs:
                    continue
                color = colors.setdefault(c.setting.name, COLORS[len(colors) % len(COLORS)])
                style = dict(color=color, linestyle="-" if c.model == "pers" else "-.", linewidth=1.2)
                _band(acc_ax, mean_curve(jobs, f"{c.model}_acc"), c.label, style)
                # train_loss is the global model's: drawn once per run, under its GM curve's label when it has one
                has_gm = any(o.setting == c.setting and o.model == "global" for o in by_model[m])
                if c.model == "global" or not has_gm:
                    _band(loss_ax, mean_curve(jobs, "train_loss"), c.label if has_gm else f"{c.label} (global model)",
                          style)
                last = [float(j.metrics[f"{c.model}_acc"].iloc[-1]) for j in jobs]
                best = [float(j.metrics[f"{c.model}_acc"].max()) for j in jobs]
                # the mean of the last LAST_EVALS evaluated rounds: one evaluation of a PM curve swings by
                # points from one evaluation to the next (the paper's curves are moving averages)
                tail = [float(j.metrics[f"{c.model}_acc"].dropna().tail(LAST_EVALS).mean()) for j in jobs]
                runs = {(j.settings.get("protocol"), j.settings.get("data")) for j in jobs}
                ran_as |= runs
                rows.append({"figure": f, "data": data, "model": m, "curve": c.label, "setting": c.setting.name,
                             "protocol": "/".join(sorted({str(p) for p, _ in runs})),
                             "fedrun_data": "/".join(sorted({str(d) for _, d in runs})),
                             "seeds": len(jobs), "rounds": int(jobs[0].metrics["round"].iloc[-1]),
                             "acc_last_round_mean": 100 * _mean(last),
                             "acc_last_round_std": 100 * _paper.sample_std(last),
                             "acc_best_round_mean": 100 * _mean(best),
                             "acc_best_round_std": 100 * _paper.sample_std(best),
                             "acc_last_evals_mean": 100 * _mean(tail),
                             "acc_last_evals_std": 100 * _paper.sample_std(tail)})
            acc_ax.set(title=model_title, xlabel="global round", ylabel="test accuracy (pooled)")
            loss_ax.set(title=f"{model_title}: global models", xlabel="global round",
                        ylabel="training loss (global model)")
            for ax in (acc_ax, loss_ax):
                ax.grid(alpha=0.3)
                if ax.lines:
                    ax.legend(fontsize=7)
        png = os.path.join(out, f"figure{f}.png")
        n_seeds = max((len(found.get(c.setting.name, [])) for m, _ in shown for c in by_model[m]), default=0)
        how = ", ".join(f"protocol={p}, data={d}" for p, d in sorted(ran_as, key=str))
        head = (f"pFedMe Figure {f} (fedrun): {title}; {how}; "
                + (f"mean over {n_seeds} seeds, band ± std" if n_seeds > 1 else "one seed"))
        save_figure(fig, png, "\n".join(textwrap.wrap(head, 62 * len(shown))))  # one column: a narrow title
        print(f"wrote {png}")
    if not rows:
        sys.exit("error: no finished runs to draw")
    write_csv(os.path.join(out, "figures.csv"), rows)
    lines = ["| figure | model | curve | last-round accuracy % | best-round accuracy % | "
             f"mean of the last {LAST_EVALS} evaluations % | seeds | rounds |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['figure']} | {r['model'].upper()} | {r['curve']} | "
                     f"{_paper.mean_pm_std(r['acc_last_round_mean'], r['acc_last_round_std'])} | "
                     f"{_paper.mean_pm_std(r['acc_best_round_mean'], r['acc_best_round_std'])} | "
                     f"{_paper.mean_pm_std(r['acc_last_evals_mean'], r['acc_last_evals_std'])} | {r['seeds']} | "
                     f"{r['rounds']} |")
    gaps = _gaps(rows)
    if gaps:
        lines += ["", "pFedMe PM minus pFedMe GM / Per-FedAvg / FedAvg, percentage points (best round, as the paper's "
                      "max over rounds):", "", "| figure | model | paper | fedrun |", "|---|---|---|---|"] + gaps
    text = "\n".join(lines) + "\n"
    write_atomic(os.path.join(out, "figures.md"), text)
    print(text)
    return rows


def _gaps(rows: list[dict]) -> list[str]:
    out = []
    for f, by_model in PAPER_GAPS.items():
        for m, paper in by_model.items():
            acc = {r["curve"]: r["acc_best_round_mean"] for r in rows if r["figure"] == f and r["model"] == m}
            others = ("pFedMe (GM)", "Per-FedAvg", "FedAvg")
            if "pFedMe (PM)" not in acc or not all(o in acc for o in others):
                continue
            ours = [acc["pFedMe (PM)"] - acc[o] for o in others]
            out.append(f"| {f} | {m.upper()} | {' / '.join(f'{x:+.1f}' for x in paper)} | "
                       f"{' / '.join(f'{x:+.1f}' for x in ours)} |")
    return out


def _band(ax, c, label: str, style: dict) -> None:
    import pandas as pd

    if c.empty:
        return
    line, = ax.plot(c["round"], c["mean"], label=label, **style)
    std = pd.to_numeric(c["std"], errors="coerce")
    if std.notna().any():
        ax.fill_between(c["round"], c["mean"] - std, c["mean"] + std, color=line.get_color(), alpha=0.15, linewidth=0)


def _mean(v: list[float]) -> float:
    return sum(v) / len(v)


def bad_input(message: str) -> None:
    """One line on stderr and exit status 2 (as argparse's own errors), before any work starts."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_figures(text: str) -> list[int]:
    try:
        figs = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        figs = []
    if not figs or any(f not in FIGURES for f in figs):
        bad_input(f"--figures {text!r} is not allowed; comma-separated, from {', '.join(map(str, FIGURES))}")
    return figs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    _paper.common_options(ap, NAME)
    ap.add_argument("--figures", default="1,2,3,4", help="comma-separated figure numbers (default: %(default)s)")
    ap.add_argument("--models", default="mlr,dnn",
                    help="comma-separated panels: mlr (strongly convex), dnn (nonconvex; the costly one on MNIST) "
                         "(default: %(default)s)")
    ap.add_argument("--protocol", default="honest", choices=PROTOCOLS,
                    help="fedrun protocol= (default honest; official: the authors' code's choices, as the paper ran)")
    ap.add_argument("--mnist-data", default=MNIST_DATA[0], choices=MNIST_DATA,
                    help="the MNIST split: the paper's description (default) or the authors' generator")
    args = ap.parse_args(argv)
    figures = parse_figures(args.figures)
    models = [m for m in args.models.split(",") if m]
    allowed = [m for m, _ in MODELS]
    if not models or any(m not in allowed for m in models):
        bad_input(f"--models {args.models!r} is not allowed; comma-separated, from {', '.join(allowed)}")
    models = [m for m in allowed if m in models]
    if args.rounds is not None and args.rounds < 1:
        bad_input(f"--rounds {args.rounds} is not allowed; a positive integer")
    t0 = time.time()
    out = _paper.out_dir(args, NAME)
    if not args.replot:
        _paper.make_out(out)
        print(f"outputs: {out}")
        train(args, out, figures, models, _paper.seeds_of(args))
    draw(out, figures, models, load(out, figures, models))
    print(f"done in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

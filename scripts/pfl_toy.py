#!/usr/bin/env python
"""Figure 1 of paper 004 (Acar et al., ICML 2021): the three-device toy problem in two dimensions,
with fedrun's own algorithms.

The paper draws the contours of each device's meta-loss f_i o T_i (MAML: T_i(w) = w - a grad f_i(w))
and of the global loss F = mean_i f_i o T_i in a two-dimensional parameter space, marks the minima,
and argues that Per-FedAvg's local steps pull the server model towards the active device's minimum
(device bias) while PFL's debiased objective points at F's minimum. The paper does not give the
toy's functions; this script defines one (below) and runs fedrun's PAvg (adaptation=maml: Per-FedAvg
as paper 004 runs it), PFLDyn (MAML) and PFLScaf (MAML) on it, one active device per round, through
fedrun.simulate.simulate, the same round loop `fedrun` runs; the path drawn is the server model after
every round (read from the round loop's checkpoint callback).

The toy: device i holds n points x ~ N(m_i, 1) in one dimension with labels y ~ Bernoulli(sigmoid(a_i x
+ c_i)) (numpy seed 0); the model is fedrun's MLR with 1 input and 2 classes. Its 4 parameters enter
the loss only through v = (W[1] - W[0], b[1] - b[0]) = (slope, intercept), and every update of these
algorithms keeps W[0] + W[1] and b[0] + b[1] fixed (gradients of a softmax over two classes are
opposite), so starting from W[0] = -W[1], b[0] = -b[1] every model lies in the 2-D plane drawn.
Each local step takes full-batch gradients (batch = all n rows, sampling=epochs: one shuffled pass
per batch), weight decay, clipping and lr decay are off, so the meta-losses drawn are exactly the ones
the algorithms descend.

    python scripts/pfl_toy.py                     # 60 rounds, seed 0 (which device is active)
    python scripts/pfl_toy.py --rounds 200 --tau 10 --out outputs/papers/pfl_toy/mine
    python scripts/pfl_toy.py --quick             # 4 rounds, coarse contours (smoke test)

Writes toy.png (panels: the three devices' meta-losses, F with the methods' paths, distance of each
path to F's minimizer by round), paths.csv (round, method, slope, intercept, F, distance) and
toy.md (the minima and each method's final distance) into the output folder it prints.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _paper  # noqa: E402,F401  (sys.path: the scripts' folder, as the other paper scripts)

NAME = "pfl_toy"
# (x mean, true slope, true intercept) of the three devices' data
DEVICES = ((-1.0, 3.0, 1.0), (1.0, -2.0, 0.5), (0.0, 0.5, -2.0))
N = 200             # points per device
INNER_LR = 0.5      # MAML step a of T_i (fedrun: algo.inner_lr, inner_steps=1)
START = (-3.0, 3.0)  # the server model at round 0 (slope, intercept): the paper's x mark
# method key -> (label, conf/algo file, options over that file's defaults)
METHODS = {
    "perfedavg": ("Per-FedAvg (MAML)", "pavg", {}),
    "pfldyn": ("PFLDyn (MAML)", "pfldyn", {"alpha": 0.1}),
    "pflscaf": ("PFLScaf (MAML)", "pflscaf", {}),
}
COMMON = {"lr_decay": 1.0, "weight_decay": 0.0, "clip": 0, "adaptation": "maml", "inner_lr": INNER_LR,
          "inner_steps": 1, "first_order": False, "test_steps": None, "eval_model": "server"}
STYLES = {"perfedavg": dict(color="black", linestyle="--"), "pfldyn": dict(color="tab:red"),
          "pflscaf": dict(color="tab:blue")}


def toy_data():
    """The three devices' data as fedrun.data.FederatedData (train = test: the toy has no test)."""
    from fedrun.data.federated import ClientSplit, FederatedData

    rng = np.random.RandomState(0)
    parts = []
    for mean, a, c in DEVICES:
        x = rng.normal(mean, 1.0, size=(N, 1)).astype(np.float32)
        y = (rng.uniform(size=N) < 1 / (1 + np.exp(-(a * x[:, 0] + c)))).astype(np.int64)
        parts.append((x, y))
    split = ClientSplit.from_parts(parts)
    return FederatedData(name="toy3", train=split, test=split, num_classes=2)


def to_params(v):
    """MLR(1, 2) parameters with slope/intercept v = (W[1] - W[0], b[1] - b[0]) and W[0] = -W[1], b[0] = -b[1]."""
    import torch

    v = torch.as_tensor(v, dtype=torch.float32)
    return {"linear.weight": torch.stack([-v[..., 0:1] / 2, v[..., 0:1] / 2], dim=-2),
            "linear.bias": torch.stack([-v[..., 1] / 2, v[..., 1] / 2], dim=-1)}


def to_plane(params) -> np.ndarray:
    w, b = params["linear.weight"], params["linear.bias"]
    return np.array([float(w[1, 0] - w[0, 0]), float(b[1] - b[0])])


def algorithm(key: str, lr: float):
    """fedrun's algorithm `key` from its conf/algo yaml (the defaults' one source), the toy's options on top."""
    from omegaconf import OmegaConf

    from fedrun.config import group_file, instantiate_checked
    from fedrun.run.protocol import apply_protocol

    _, name, options = METHODS[key]
    algo = OmegaConf.merge(OmegaConf.load(group_file("algo", name)), {**COMMON, **options, "lr": lr})
    cfg = OmegaConf.create({"protocol": "honest", "algo": algo})
    apply_protocol(cfg)
    return instantiate_checked(cfg.algo)


def meta_losses(engine, data, grid):
    """f_i o T_i at the points `grid` [P, 2] for every device: [3, P] (T_i: one full-batch step of INNER_LR)."""
    import torch
    from torch.func import grad, vmap

    out = []
    for c in range(data.num_clients):
        rows = data.train.client_rows(c)
        x, y = data.train.x[rows], data.train.y[rows]

        def meta(v):
            p = to_params(v)
            g = grad(engine.loss)(p, x, y)
            return engine.loss({k: p[k] - INNER_LR * g[k] for k in p}, x, y)

        with torch.no_grad():
            out.append(torch.cat([vmap(meta)(chunk) for chunk in torch.as_tensor(grid,
                                                                                 dtype=torch.float32).split(4096)]))
    return torch.stack(out).numpy()


def minimize(engine, data, start, weights) -> np.ndarray:
    """argmin of sum_i weights_i f_i o T_i by gradient descent from `start` (for the circles and the star)."""
    import torch

    v = torch.tensor(start, dtype=torch.float32, requires_grad=True)
    opt = torch.optim.LBFGS([v], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = 0
        for c, w in enumerate(weights):
            if w:
                rows = data.train.client_rows(c)
                x, y = data.train.x[rows], data.train.y[rows]
                p = to_params(v)
                g = torch.autograd.grad(engine.loss(p, x, y), list(p.values()), create_graph=True)
                loss = loss + w * engine.loss({k: p[k] - INNER_LR * gk for k, gk in zip(p, g)}, x, y)
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    return v.detach().numpy().astype(float)


def run_method(key: str, data, rounds: int, tau: int, lr: float, seed: int) -> list[np.ndarray]:
    """The server model (in the plane) at rounds 0..rounds of fedrun's round loop."""
    from fedrun.engine import ENGINES
    from fedrun.models import MLR
    from fedrun.simulate import Schedule, simulate

    engine = ENGINES["vmap"](MLR(1, 2))
    sched = Schedule(rounds=rounds, tau=tau, clients_per_round=1, batch_size=N, eval_every=rounds, sampling="epochs")
    path = [np.array(START)]
    simulate(algorithm(key, lr), engine, data, to_params(START), sched, seed,
             on_checkpoint=lambda at: path.append(to_plane(at.state.params)), checkpoint_every=1)
    return path


def bad_input(message: str) -> None:
    """One line on stderr and exit status 2 (as argparse's own errors), before any work starts."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 rounds and coarse contours (smoke test)")
    ap.add_argument("--rounds", type=int, default=None, help="communication rounds (default 60; --quick 4)")
    ap.add_argument("--tau", type=int, default=5, help="local steps per round (default %(default)s)")
    ap.add_argument("--lr", type=float, default=0.3, help="local (outer) learning rate (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="run seed: which device is active each round (default 0)")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, from {', '.join(METHODS)}")
    ap.add_argument("--out", default=None, help=f"output folder (default: outputs/papers/{NAME}/<date>_<time>[_quick])")
    args = ap.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        bad_input(f"--methods {','.join(bad) or '(empty)'} is not allowed; choose from {', '.join(METHODS)}")
    rounds = args.rounds if args.rounds is not None else (4 if args.quick else 60)
    for name, v in (("--rounds", rounds), ("--tau", args.tau)):
        if v < 1:
            bad_input(f"{name} {v} is not allowed; a positive integer")
    if not args.lr > 0:
        bad_input(f"--lr {args.lr} is not allowed; a positive number")
    t0 = time.time()
    args.replot = None
    out = _paper.out_dir(args, NAME)
    _paper.make_out(out)
    print(f"outputs: {out}")
    print(f"toy: 3 devices x {N} points, MAML step {INNER_LR}, start {START}, {rounds} rounds x {args.tau} local steps "
          f"of lr {args.lr}, 1 active device per round (seed {args.seed})")

    import torch

    from fedrun.engine import ENGINES
    from fedrun.models import MLR
    from fedrun.outputs import write_atomic, write_csv

    torch.set_num_threads(1)  # tiny tensors: threads only cost
    data = toy_data()
    engine = ENGINES["vmap"](MLR(1, 2))
    paths = {k: run_method(k, data, rounds, args.tau, args.lr, args.seed) for k in methods}
    minima = [minimize(engine, data, START, [int(i == c) for i in range(3)]) for c in range(3)]
    star = minimize(engine, data, np.mean(minima, axis=0), [1 / 3] * 3)

    pts = np.concatenate([np.stack(p) for p in paths.values()] + [np.stack(minima), star[None], np.array([START])])
    lo, hi = pts.min(0), pts.max(0)
    pad = 0.15 * (hi - lo) + 0.5
    res = 40 if args.quick else 100
    gx, gy = np.meshgrid(np.linspace(lo[0] - pad[0], hi[0] + pad[0], res),
                         np.linspace(lo[1] - pad[1], hi[1] + pad[1], res))
    z = meta_losses(engine, data, np.stack([gx.ravel(), gy.ravel()], 1))
    F = lambda v: float(meta_losses(engine, data, np.asarray(v, dtype=np.float32)[None]).mean())  # noqa: E731

    rows = []
    for k, p in paths.items():
        for r, v in enumerate(p):
            rows.append({"round": r, "method": k, "slope": float(v[0]), "intercept": float(v[1]), "F": F(v),
                         "distance_to_F_min": float(np.linalg.norm(v - star))})
    write_csv(os.path.join(out, "paths.csv"), rows)
    draw(os.path.join(out, "toy.png"), gx, gy, z, minima, star, paths, rounds, args)
    lines = [f"Paper 004 Figure 1 toy (fedrun): {rounds} rounds x {args.tau} local steps of lr {args.lr}, seed "
             f"{args.seed}.",
             "", "| point | slope | intercept | F |", "|---|---|---|---|"]
    for i, m in enumerate(minima):
        lines.append(f"| device {i + 1} minimum of f_{i + 1} o T_{i + 1} | {m[0]:.3f} | {m[1]:.3f} | {F(m):.4f} |")
    lines.append(f"| minimum of F | {star[0]:.3f} | {star[1]:.3f} | {F(star):.4f} |")
    lines += ["", "| method | final slope | final intercept | F | distance to F's minimum |", "|---|---|---|---|---|"]
    for k, p in paths.items():
        lines.append(f"| {METHODS[k][0]} | {p[-1][0]:.3f} | {p[-1][1]:.3f} | {F(p[-1]):.4f} | "
                     f"{np.linalg.norm(p[-1] - star):.4f} |")
    text = "\n".join(lines) + "\n"
    write_atomic(os.path.join(out, "toy.md"), text)
    print(text)
    print(f"wrote toy.png, paths.csv and toy.md in {out}")
    print(f"done in {time.time() - t0:.0f}s")
    return 0


def draw(png, gx, gy, z, minima, star, paths, rounds, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedrun.plots import save_figure

    fig = plt.figure(figsize=(12.5, 8))
    grid = fig.add_gridspec(2, 3)
    axes = [fig.add_subplot(grid[0, i]) for i in range(3)] + [fig.add_subplot(grid[1, :2]), fig.add_subplot(grid[1, 2])]
    panels = [(f"device {i + 1}: f{i + 1} ∘ T{i + 1}", z[i]) for i in range(3)] + [("global F = mean of the three",
                                                                                    z.mean(0))]
    for i, (ax, (title, zz)) in enumerate(zip(axes, panels)):
        zz = zz.reshape(gx.shape)
        levels = np.quantile(zz, np.linspace(0.0, 0.9, 14) ** 2)
        ax.contour(gx, gy, zz, levels=np.unique(levels), cmap="viridis", linewidths=0.8)
        ax.plot(*START, "kx", markersize=10, mew=2, label="start")
        if i < 3:
            ax.plot(*minima[i], "o", color="tab:orange", markersize=9, mfc="none", mew=2,
                    label=f"device {i + 1} minimum")
        else:
            for j, m in enumerate(minima):
                ax.plot(*m, "o", color="tab:orange", markersize=7, mfc="none", mew=1.5)
                ax.annotate(str(j + 1), m, textcoords="offset points", xytext=(5, 5), fontsize=8)
            ax.plot(*star, "*", color="tab:green", markersize=14, label="minimum of F")
            for k, p in paths.items():
                p = np.stack(p)
                ax.plot(p[:, 0], p[:, 1], marker=".", markersize=3, linewidth=1.2, label=METHODS[k][0], **STYLES[k])
        ax.set(title=title, xlabel="slope  W[1]-W[0]", ylabel="intercept  b[1]-b[0]")
        ax.legend(fontsize=7, loc="best")
    ax = axes[4]
    for k, p in paths.items():
        d = np.linalg.norm(np.stack(p) - star, axis=1)
        ax.plot(range(len(d)), d, label=METHODS[k][0], **STYLES[k])
    ax.set(title="distance of the server model to F's minimum", xlabel="round", ylabel="‖w_t − w*‖", yscale="log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, png, f"Paper 004 Figure 1 (fedrun): 3 devices, 1 active per round, {rounds} rounds x {args.tau} "
                          f"local full-batch steps (lr {args.lr}), MAML step {INNER_LR}")


if __name__ == "__main__":
    sys.exit(main())

"""The Shakespeare LSTM's training step over the clients of a round, three ways (s/step: forward and
backward of every client's minibatch loss, the engine's `grad`):

  vmap    fedrun's model in the vmap engine: its gradients through LSTM.stacked_ce_grad (branch "rnn":
          on the CPU client by client through the fused LSTM, elsewhere the recurrence batched)
  loop    the same model, client by client (the loop engine)
  nn.LSTM the same weights through torch's fused nn.LSTM (cuDNN on a GPU), client by client: the
          per-client loop a vmap-less simulator runs

    python -m fedrun.bench.lstm [--clients 10] [--batch 10] [--steps 5] [--device cpu|cuda]

Then, per engine (vmap, loop): a training round (tau steps of every client's minibatch) against the
evaluation with test-time fine-tuning FedAvg+FT runs (`finetune_steps` full-batch steps on every client's
training rows from the shared model, then every client's test rows scored), and their ratio; beside it
the ratio of rows through forward and backward (the arithmetic's share: what the ratio would be at equal
cost per row):

    python -m fedrun.bench.lstm [--ft-clients 4 --ft-train 20 --ft-test 5 --tau 2 --finetune-steps 5]

LEAF's sizes (sequence 80, embedding 8, 2 x 256, 80 characters); the numbers are in docs/models.md and
docs/performance.md.
"""
from __future__ import annotations

import argparse
import time

import torch

from ..engine import LoopEngine, VmapEngine, params_of, stack
from ..engine.tree import Params
from ..models import LSTM


class TorchLSTM(LSTM):
    """fedrun's LSTM with nn.LSTM's own forward (same parameters and names)."""

    def forward(self, x: torch.Tensor, features: bool | str = False):
        return self.head(self.lstm(self.embedding(x))[0][:, -1])


def _seconds(engine, params, x, y, steps: int, device: torch.device) -> float:
    engine.grad(params, x, y)  # warm-up (allocations, cuDNN plans)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        engine.grad(params, x, y)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps


def bench(clients: int = 10, batch: int = 10, steps: int = 5, device: str = "cpu", seq: int = 80) -> dict[str, float]:
    """Seconds per step of each way, for `clients` clients of `batch` sequences of `seq` characters."""
    dev = torch.device(device)
    torch.manual_seed(0)
    model = LSTM(seq, 80).to(dev)
    params = {k: v + 0.01 * torch.randn_like(v) for k, v in stack(params_of(model), clients).items()}
    x = torch.randint(0, 80, (clients, batch, seq), device=dev)
    y = torch.randint(0, 80, (clients, batch), device=dev)
    ref = TorchLSTM(seq, 80).to(dev)
    return {"vmap": _seconds(VmapEngine(model), params, x, y, steps, dev),
            "loop": _seconds(LoopEngine(model), params, x, y, steps, dev),
            "nn.LSTM": _seconds(LoopEngine(ref), params, x, y, steps, dev)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _round_and_eval(engine, params: Params, data, tau: int, batch: int, finetune_steps: int, lr: float = 0.05,
                    device: torch.device = torch.device("cpu")) -> tuple[float, float]:
    """Seconds of one training round (tau SGD steps of every client on a minibatch of `batch` rows)
    and of one evaluation with fine-tuning (`finetune_steps` full-batch steps from the shared model
    on every client's training rows, as fedrun.algorithms.personalize.finetune takes them, then the
    test rows scored), each after one untimed repetition."""
    clients = data.train.num_clients
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, int(data.train.sizes.min()), (tau, clients, batch), generator=g)
    rows = (idx + data.train.offsets.cpu().view(1, -1, 1)).to(device)
    xs, ys = data.train.x[rows], data.train.y[rows]

    def train():
        p = stack(params, clients)
        for s in range(tau):
            gr, _ = engine.grad(p, xs[s], ys[s])
            p = {k: v - lr * gr[k] for k, v in p.items()}
        return p

    def evaluate():
        p = params
        for s in range(finetune_steps):
            gr, _ = engine.full_grad(p, data.train, shared=s == 0)
            p = {k: v - lr * gr[k] for k, v in p.items()}
        return engine.evaluate(p, data.test, False)

    out = []
    for fn in (train, evaluate):
        fn()
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        out.append(time.perf_counter() - t)
    return out[0], out[1]


def finetune_bench(clients: int = 4, train: int = 20, test: int = 5, tau: int = 2, batch: int = 10,
                   finetune_steps: int = 5, device: str = "cpu") -> dict[str, tuple[float, float]]:
    """Per engine, seconds of a training round and of an evaluation with fine-tuning (`_round_and_eval`),
    LEAF's LSTM on random 80-character rows, `train` / `test` of them per client."""
    from .settings import make_data

    dev = torch.device(device)
    data = make_data("shakespeare", clients, train, test).to(dev)
    torch.manual_seed(0)
    model = LSTM(80, 80).to(dev)
    params = params_of(model)
    return {name: _round_and_eval(engine, params, data, tau, batch, finetune_steps, device=dev)
            for name, engine in (("vmap", VmapEngine(model)), ("loop", LoopEngine(model)))}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--ft-clients", type=int, default=4, help="clients of the round / evaluation rows")
    p.add_argument("--ft-train", type=int, default=20, help="training rows per client (fine-tuned on)")
    p.add_argument("--ft-test", type=int, default=5, help="test rows per client (scored)")
    p.add_argument("--tau", type=int, default=2, help="local steps of the training round")
    p.add_argument("--finetune-steps", type=int, default=5, help="full-batch fine-tuning steps (0: no round/eval rows)")
    p.add_argument("--no-steps", action="store_true", help="only the round/eval rows")
    a = p.parse_args(argv)
    name = torch.cuda.get_device_name() if a.device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    print(f"Shakespeare LSTM, {a.clients} clients x batch {a.batch} x 80 characters, {name}")
    if not a.no_steps:
        steps = bench(a.clients, a.batch, a.steps, a.device)
        for way, s in steps.items():
            print(f"{way:8s} {s:.4f} s/step")
        print(f"vmap/loop {steps['vmap'] / steps['loop']:.2f}   vmap/nn.LSTM {steps['vmap'] / steps['nn.LSTM']:.2f}")
    if a.finetune_steps:
        rows = a.finetune_steps * a.ft_train + a.ft_test / 3  # (a forward alone: ~1/3 of forward and backward)
        print(f"training round ({a.ft_clients} clients x tau {a.tau} x batch {a.batch}) against evaluation with "
              f"{a.finetune_steps} fine-tuning steps ({a.ft_train} training, {a.ft_test} test rows per client); "
              f"rows' arithmetic ratio {rows / (a.tau * a.batch):.2f}")
        for way, (tr, ev) in finetune_bench(a.ft_clients, a.ft_train, a.ft_test, a.tau, a.batch, a.finetune_steps,
                                            a.device).items():
            print(f"{way:8s} round {tr:.4f} s   eval {ev:.4f} s   eval/round {ev / tr:.2f}")


if __name__ == "__main__":
    main()

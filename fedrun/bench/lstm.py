"""The Shakespeare LSTM's training step over the clients of a round, three ways (s/step: forward and
backward of every client's minibatch loss, the engine's `grad`):

  vmap    fedrun's model (recurrence as matrix products) in the vmap engine: one computation
  loop    the same model, client by client (the loop engine)
  nn.LSTM the same weights through torch's fused nn.LSTM (cuDNN on a GPU), client by client: the
          per-client loop a vmap-less simulator runs

    python -m fedrun.bench.lstm [--clients 10] [--batch 10] [--steps 5] [--device cpu|cuda]

LEAF's sizes (sequence 80, embedding 8, 2 x 256, 80 characters); the numbers are in docs/models.md.
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from ..engine import LoopEngine, VmapEngine, params_of, stack
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    name = torch.cuda.get_device_name() if a.device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    print(f"Shakespeare LSTM, {a.clients} clients x batch {a.batch} x 80 characters, {name}")
    for way, s in bench(a.clients, a.batch, a.steps, a.device).items():
        print(f"{way:8s} {s:.4f} s/step")


if __name__ == "__main__":
    main()

"""`fedrun-bench --setting resnet|shakespeare|agnews`: today's PFL models at their data's shapes.

The data are in-memory tensors of the real shapes (nothing to download, no loader involved):
  resnet       ResNet-18 (conf/model/resnet18: BatchNorm, the CIFAR stem) on CIFAR-100-shaped images:
               N(0, 1) 3x32x32, 100 classes, labels skewed per client (each client draws from 10 of
               the classes); 100 clients x 500 train / 100 test images; batch 50
  shakespeare  the LEAF character LSTM (conf/model/lstm: embedding 8, 2 x 256) on 80-character
               sequences of an 80-symbol vocabulary, the next character as the label; 100 clients x
               500 train / 100 test sequences; batch 10 (LEAF's)
  agnews       TextCNN (conf/model/textcnn: vocabulary 30,000, embedding 512, 100 filters of widths
               3/4/5) on token sequences of AG News's shape: 4 classes, 120,000 train / 7,600 test
               rows of 200 token ids (PFLlib's max_len) dealt to 100 clients; batch 50
FedAvg (the global model, as PFLlib's FedAvg scores it), 10 clients a round, tau local steps (default
10: about one epoch of a client's 500 rows at batch 50), every client evaluated every round. Printed
per setting: s/round of the vmap and the loop engine, their ratio, and the peak memory (CUDA:
max_memory_allocated over the timed rounds; CPU: the process's peak resident set, which only grows).
`--tiny` shrinks every size (a few clients and rows, narrow models) for a CPU's minutes.

    fedrun-bench --setting resnet [--tiny] [--rounds 3 --loop-rounds 1 --warmup 1] [--device cuda]
"""
from __future__ import annotations

import resource
import time

import torch

from ..data import ClientSplit, FederatedData

NAMES = ("resnet", "shakespeare", "agnews")
# per setting: clients, train / test rows per client, batch, the model and its options; --tiny's
FULL = {
    "resnet": dict(clients=100, train=500, test=100, batch=50, model="ResNet18", options={}),
    "shakespeare": dict(clients=100, train=500, test=100, batch=10, model="LSTM", options={}),
    "agnews": dict(clients=100, train=1200, test=76, batch=50, model="TextCNN", options={}),
}
TINY = {
    "resnet": dict(clients=4, train=8, test=4, batch=4, model="ResNet18", options={"width": 4}),
    "shakespeare": dict(clients=4, train=8, test=4, batch=4, model="LSTM", options={"hidden": 16}),
    "agnews": dict(clients=4, train=8, test=4, batch=4, model="TextCNN", options={"dim": 16, "channels": 8}),
}


def make_data(name: str, clients: int, train: int, test: int, seed: int = 0) -> FederatedData:
    """Random rows of setting `name`'s shapes, `train` / `test` of them per client."""
    g = torch.Generator().manual_seed(seed)

    def split(n: int) -> ClientSplit:
        owner = torch.arange(clients).repeat_interleave(n)
        if name == "resnet":  # 100 classes, each client's labels from its 10 classes
            y = (owner * 10 + torch.randint(0, 10, (clients * n,), generator=g)) % 100
            x = torch.randn(clients * n, 3, 32, 32, generator=g)
        elif name == "shakespeare":  # 80 characters of context, the 81st as the label
            x = torch.randint(0, 80, (clients * n, 80), generator=g)
            y = torch.randint(0, 80, (clients * n,), generator=g)
        else:  # AG News: 200 token ids (0 pads the shorter rows' tails), 4 classes
            x = torch.randint(1, 30000, (clients * n, 200), generator=g)
            length = torch.randint(20, 201, (clients * n, 1), generator=g)
            x = torch.where(torch.arange(200) < length, x, torch.zeros_like(x))
            y = torch.randint(0, 4, (clients * n,), generator=g)
        return ClientSplit.from_flat(x, y, torch.full((clients,), n, dtype=torch.long))

    classes = {"resnet": 100, "shakespeare": 80, "agnews": 4}[name]
    return FederatedData(name, split(train), split(test), classes)


def _peak_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # (Linux: KB)


def main(name: str, device: torch.device, tiny: bool, rounds: int, loop_rounds: int, warmup: int,
         tau: int | None) -> list[dict]:
    from .. import models
    from ..algorithms import build
    from ..simulate import Schedule
    from .common import time_rounds

    s = (TINY if tiny else FULL)[name]
    data = make_data(name, s["clients"], s["train"], s["test"]).to(device)
    tau = tau or (2 if tiny else 10)
    m = min(10, data.num_clients)
    cls = getattr(models, s["model"])
    model_fn = lambda: cls(data.in_features, data.num_classes, **s["options"])
    print(f"device={device} threads={torch.get_num_threads()} setting={name}{' (tiny)' if tiny else ''}: "
          f"{s['model']}{s['options'] or ''}, {data.num_clients} clients x {s['train']} train / {s['test']} test rows "
          f"{tuple(data.feature_shape)}, {data.num_classes} classes; FedAvg (global model), {m} clients/round, "
          f"tau={tau}, batch {s['batch']}, every client evaluated every round", flush=True)
    print(f"{'engine':<8}{'s/round':>10}{'peak MB':>10}")
    out = []
    for engine, n in (("vmap", rounds), ("loop", loop_rounds)):
        if n < 1:
            continue
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        sched = Schedule(rounds=n, tau=tau, clients_per_round=m, batch_size=s["batch"])
        t0 = time.perf_counter()
        try:
            sec = time_rounds(build("fedavg", alpha=None), engine, data, sched, device, warmup, model_fn=model_fn)
        except Exception as e:  # (an out-of-memory, say: printed, the other engine goes on)
            print(f"{engine:<8}ERROR {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}", flush=True)
            continue
        out.append(dict(setting=name, engine=engine, s_round=sec, peak_mb=_peak_mb(device),
                        wall=time.perf_counter() - t0))
        print(f"{engine:<8}{sec:>10.4f}{out[-1]['peak_mb']:>10.0f}", flush=True)
    if len(out) == 2:
        print(f"loop/vmap {out[1]['s_round'] / out[0]['s_round']:.2f}", flush=True)
    return out

"""What the bench tools share: the named algorithm settings, CIFAR-shaped data, and timed rounds."""
from __future__ import annotations

import os
import pickle
import time

import numpy as np
import torch

from ..algorithms import build
from ..data import ClientSplit, FederatedData
from ..data.datasets.cifar import CIFAR_FILES
from ..engine import ENGINES, params_of
from ..models import MLP
from ..simulate import Schedule, simulate


def sync(device) -> None:
    """Waits for the device's queued work (CUDA), so a wall clock read after it is honest."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


# Named bench settings: a conf/algo entry and the options the setting changes (the rest come from
# its yaml). Any other conf/algo name is benched with its yaml's options as they are.
ALGOS = {
    "fedavg": ("fedavg", {}),
    "perfedavg-fo": ("perfedavg", {"variant": "fo"}),
    "perfedavg-hf": ("perfedavg", {"variant": "hf"}),
    "perfedavg-exact": ("perfedavg", {"variant": "exact"}),
    "pfedme": ("pfedme", dict(lam=30, beta=2.0, mu=0.001, personalized="local", train_all=True)),
}
AGGREGATE = {"pfedme": "samples"}
# Paper 004's CIFAR settings (lr 0.1; Per-FedAvg meta lr 1e-2); its own algorithms' yamls already are.
CIFAR_ALGOS = {
    "fedavg": ("fedavg", {"beta": 0.1, "alpha": 0.1}),
    "perfedavg-fo": ("perfedavg", {"alpha": 0.01, "beta": 0.1, "variant": "fo"}),
    "perfedavg-hf": ("perfedavg", {"alpha": 0.01, "beta": 0.1, "variant": "hf"}),
}


def bench_algo(name: str, settings: dict):
    """The algorithm `name` names: a bench setting of `settings`, else a conf/algo entry as it is."""
    algo, options = settings.get(name, (name, {}))
    return build(algo, **options)


def cifar_like(clients: int = 100, train: int = 500, test: int = 100, num_classes: int = 10, k: int = 5,
               seed: int = 0, chunk_len: int = 256) -> FederatedData:
    """Random N(0, 1) images 3x32x32 in the ACID shape: device c's labels drawn from its k classes
    (c + j) mod num_classes, `train` / `test` images per device, crop+flip on training batches with
    the padding of data.pad_fill=black (CIFAR-10's black pixel normalized)."""
    g = torch.Generator().manual_seed(seed)
    owner = {n: torch.arange(clients).repeat_interleave(n) for n in (train, test)}

    def split(n: int) -> ClientSplit:
        y = (owner[n] + torch.randint(0, k, (clients * n,), generator=g)) % num_classes
        x = torch.randn(clients * n, 3, 32, 32, generator=g)
        return ClientSplit.from_flat(x, y, torch.full((clients,), n, dtype=torch.long), chunk_len)

    return FederatedData("cifar_like", split(train), split(test), num_classes, augment="crop_flip",
                         augment_fill=torch.tensor([-1.989, -1.981, -1.707]))  # -mean/std of CIFAR-10's channels


def time_rounds(algo, engine_name, data, sched, device, warmup: int, seed: int = 0, model_fn=None,
                cpu: bool = False) -> float | tuple[float, float]:
    """Wall seconds per round after `warmup` rounds (with `cpu`: and this process's CPU seconds per
    round over the same timed rounds)."""
    torch.manual_seed(seed)
    model = (model_fn or (lambda: MLP(data.in_features, data.num_classes, hidden=[20])))().to(device)
    engine = ENGINES[engine_name](model)
    warm = Schedule(**{**sched.__dict__, "rounds": warmup})
    simulate(algo, engine, data, params_of(model), warm, seed)
    sync(device)
    t0, c0 = time.perf_counter(), time.process_time()
    simulate(algo, engine, data, params_of(model), sched, seed)
    sync(device)
    wall, cpu_s = (time.perf_counter() - t0) / sched.rounds, (time.process_time() - c0) / sched.rounds
    return (wall, cpu_s) if cpu else wall


def write_cifar10(root: str, train_per_class: int, test_per_class: int, seed: int = 0) -> None:
    """Random uint8 images in CIFAR-10's python format (the five data_batch_N and test_batch pickles
    fedrun's loader reads), `train_per_class` / `test_per_class` images of each of the 10 classes."""
    folder, train_files, test_files, key = CIFAR_FILES[10]
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(root, folder), exist_ok=True)
    for files, per_class in ((train_files, train_per_class), (test_files, test_per_class)):
        y = rng.permutation(np.repeat(np.arange(10), per_class))
        x = rng.integers(0, 256, size=(len(y), 3072), dtype=np.uint8)
        for f, xs, ys in zip(files, np.array_split(x, len(files)), np.array_split(y, len(files))):
            with open(os.path.join(root, folder, f), "wb") as fh:
                pickle.dump({b"data": xs, key: ys.tolist(), b"batch_label": b"fedrun gpu-check"}, fh)

"""`fedrun-bench --gpu-check --gpu-check-parts memory`: runs fitted to a memory cap (fedrun.run.memory).

Two settings, each run all at once (no plan, no cap: the baseline), with memory=auto, and with the
device capped at 24 GB and at 8 GB (torch.cuda.set_per_process_memory_fraction of the device's total
memory, and memory=<cap>, so the plan and the allocator see the same budget):
  cifar_acid   experiment=cifar10_acid5_pfldyn_proto (paper 004's CNN, 100 devices, tau=K=50, batch 50)
               through fedrun's CIFAR loader, on generated files in CIFAR-10's format unless FEDRUN_DATA
               holds cifar-10-batches-py
  resnet18     ResNet-18 (BatchNorm) on CIFAR-100, partition=dirichlet alpha 0.1, 100 clients, 10 per
               round, batch 50, tau=10 (about one epoch of a client's 500 rows), FedAvg (the global model:
               algo.alpha=null), every client
               evaluated every round; generated files in CIFAR-100's format unless FEDRUN_DATA holds
               cifar-100-python
Printed per row: s/round, peak memory (CUDA: max_memory_allocated over the timed rounds), the plan
(clients at once, row chunks per full pass, the seconds its probes took), and the time against the
all-at-once row (the planner's overhead where all at once fits the cap; target <= 10%). A row that
fails prints its error and the others go on.

On the CPU (`--gpu-check-device cpu`, the tests) the same path runs at tiny sizes, with the caps
enforced by fedrun.run.memory.AllocationMeter instead of the CUDA allocator.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import time

import numpy as np
import torch

GB = 2**30
# (cap label, GB): None = no cap
FULL_CAPS = (("all at once", None), ("auto", "auto"), ("24 GB", 24), ("8 GB", 8))
TINY_CAPS = (("all at once", None), ("0.15 GB", 0.15))  # (the CPU's auto is no cap: all at once)


def write_cifar100(root: str, train_per_class: int, test_per_class: int, seed: int = 0) -> None:
    """Random uint8 images in CIFAR-100's python format (the `train` and `test` pickles fedrun's
    loader reads: data, fine_labels, coarse_labels = fine // 5), per class of the 100."""
    folder = "cifar-100-python"
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(root, folder), exist_ok=True)
    for name, per_class in (("train", train_per_class), ("test", test_per_class)):
        y = rng.permutation(np.repeat(np.arange(100), per_class))
        x = rng.integers(0, 256, size=(len(y), 3072), dtype=np.uint8)
        with open(os.path.join(root, folder, name), "wb") as fh:
            pickle.dump({b"data": x, b"fine_labels": y.tolist(), b"coarse_labels": (y // 5).tolist(),
                         b"batch_label": b"fedrun gpu-check"}, fh)


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from ..config import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=overrides)


def _acid(device: str, sizes: dict, tmp: str):
    from ..run.protocol import apply_protocol
    from .common import write_cifar10

    root, note = os.environ.get("FEDRUN_DATA", "data"), "real CIFAR-10"
    if not os.path.isdir(os.path.join(root, "cifar-10-batches-py")) or sizes["tiny"]:
        root, note = os.path.join(tmp, "cifar10"), "generated CIFAR-10 files"
        write_cifar10(root, *sizes["per_class"])
    cfg = _compose(["experiment=cifar10_acid5_pfldyn_proto", f"device={device}", f"data.root={root}",
                    "data.download=false", f"cache_dir={os.path.join(tmp, 'cache')}",
                    f"data.num_clients={sizes['preset_clients']}", f"tau={sizes['cifar_tau']}",
                    f"batch_size={sizes['cifar_batch']}"])
    apply_protocol(cfg)
    return cfg, "cnn", note


def _resnet(device: str, sizes: dict, tmp: str):
    root, note = os.environ.get("FEDRUN_DATA", "data"), "real CIFAR-100"
    if not os.path.isdir(os.path.join(root, "cifar-100-python")) or sizes["tiny"]:
        root, note = os.path.join(tmp, "cifar100"), "generated CIFAR-100 files"
        write_cifar100(root, *sizes["c100_per_class"])
    overrides = ["dataset=cifar100", f"dataset.root={root}", "dataset.download=false", "partition=dirichlet",
                 "partition.alpha=0.1", f"partition.num_clients={sizes['c100_clients']}", "model=resnet18",
                 "algo=fedavg", "algo.alpha=null", f"clients_per_round={min(10, sizes['c100_clients'])}",
                 f"batch_size={sizes['cifar_batch']}",
                 f"tau={sizes['resnet_tau']}", f"device={device}", f"cache_dir={os.path.join(tmp, 'cache')}"]
    if sizes["tiny"]:
        overrides += ["model.width=2", "partition.min_size=2"]
    return _compose(overrides), "resnet18", note


def _fitted_rounds(cfg, model_name: str, data, device: torch.device, option, sizes: dict):
    """Plans (memory=`option`; None: no plan) and times one setting's rounds. Returns s/round, peak MB
    of the timed rounds, the plan and the seconds its probes took."""
    from ..config import instantiate_checked, instantiate_model
    from ..engine import ENGINES, params_of
    from ..run import memory
    from ..run.spec import schedule
    from ..simulate import simulate
    from .common import sync

    algo = instantiate_checked(cfg.algo)
    sched = schedule(cfg, data.num_clients)
    sched.rounds = sizes["rounds"]
    torch.manual_seed(0)
    model = instantiate_model(cfg.model, data).to(device)
    engine = ENGINES[cfg.engine](model, max_chunks=cfg.max_chunks)
    params = params_of(model)
    cuda = device.type == "cuda"
    cap = None if option in (None, "auto") else int(option * GB)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(
            1.0 if cap is None else min(1.0, cap / torch.cuda.get_device_properties(device).total_memory),
            memory.cuda_index(device))
    # (the CPU: the cap enforced by counting the tensors the rounds allocate; CUDA: by the allocator)
    meter = contextlib.nullcontext() if cuda else memory.AllocationMeter(
        None if cap is None else cap - memory.tensor_bytes(data.train, data.test))
    try:
        t0 = time.perf_counter()
        plan = memory.Plan(None)
        if option is not None:
            budget = memory.budget_bytes(option, device)  # (the CPU's auto: None, no cap)
            plan = memory.plan(algo, engine, data, sched, params, 0, budget, what=f"model={model_name}", option=option)
        plan_s = time.perf_counter() - t0
        warm = type(sched)(**{**sched.__dict__, "rounds": sizes["warmup"]})
        with meter:
            if not sizes["tiny"]:  # (the tests' tiny CPU path times its first round)
                simulate(algo, engine, data, params, warm, 0, start_chunk=plan.clients)
                sync(device)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            else:
                meter.peak = meter.live
            t0 = time.perf_counter()
            simulate(algo, engine, data, params, sched, 0, start_chunk=plan.clients)
            sync(device)
            s = (time.perf_counter() - t0) / sched.rounds
        peak = (torch.cuda.max_memory_allocated(device) if cuda else meter.peak) / 2**20
    finally:
        if cuda:
            torch.cuda.set_per_process_memory_fraction(1.0, memory.cuda_index(device))
            torch.cuda.empty_cache()
    return s, peak, plan, plan_s, engine.max_chunks


def memory_rows(device: str, sizes: dict, tmp: str, Row) -> list:
    """The part's rows, made by `Row` (fedrun.bench.gpu_check's table row)."""
    from ..config import instantiate_checked

    dev = torch.device(device)
    caps = TINY_CAPS if sizes["tiny"] else FULL_CAPS
    rows = []
    for label, setup in (("cifar_acid", _acid), ("resnet18 c100", _resnet)):
        try:
            cfg, model_name, note = setup(device, sizes, tmp)
            data = instantiate_checked(cfg.data).to(dev)
        except Exception as e:  # the setting could not be built: one row says why, the next setting goes on
            rows.append(Row("memory", label, note=f"{type(e).__name__}: {_first(e)}", failed=True))
            print(f"memory {label}: ERROR {type(e).__name__}: {_first(e)}", flush=True)
            continue
        base = None
        for cap_label, option in caps:
            what = f"{label} {cap_label}"
            try:
                s, peak, plan, plan_s, chunks = _fitted_rounds(cfg, model_name, data, dev, option, sizes)
            except Exception as e:  # an out-of-memory or a refused plan: printed, the next cap goes on
                rows.append(Row("memory", what, note=f"{type(e).__name__}: {_first(e)}", failed=True))
                print(f"memory {what}: ERROR {type(e).__name__}: {_first(e)}", flush=True)
                continue
            if option is None:
                base = (s, peak)
            clients = "all" if plan.clients is None else plan.clients
            bits = [note] if option is None else [f"{clients} clients, {chunks} chunks/call, probes {plan_s:.1f} s"]
            if base is not None and option is not None:
                fits = option == "auto" or base[1] <= option * 1024
                bits.append(f"{s / base[0]:.2f}x all-at-once" + (" (all at once fits)" if fits else ""))
            rows.append(Row("memory", what, s, None, peak, note="; ".join(bits)))
            print(f"memory {what}: {s:.4f} s/round, peak {peak:.0f} MB; {rows[-1].note}", flush=True)
        del data
    return rows


def _first(e: BaseException) -> str:
    return str(e).splitlines()[0][:160] if str(e) else ""

"""Device-to-host reads in a round, counted: their number per round does not grow with the number of
clients, and each one that remains is named here with its reason.

What is counted (`SyncCounter`), on the CPU, of the operations that on a GPU wait for the device and
copy from it: the dispatcher's `_local_scalar_dense` (`.item()`, `float()`, `int()`, `bool()` and
Python conditionals on a tensor, indexing with a 0-d tensor), `nonzero`, `masked_select`, boolean
indexing, `unique`, `equal`/`allclose`, and `repeat_interleave` without `output_size` (each must know
a data-dependent size on the host); the linear algebra that checks its solver's `info` on the host on
CUDA: `_linalg_check_errors` (torch.linalg's non-`_ex` wrappers) and `_linalg_eigh` (eigh, eigvalsh:
the check is inside its kernel, so the op itself is counted); and the Python calls `Tensor.tolist()`, `.cpu()` and
`.numpy()` made from fedrun's code (on the CPU these never reach the dispatcher, so they are counted at the call,
whatever device the tensor is on: an upper bound). Host-to-device copies (the CPU generators' draws
moved to the device) are not syncs of this kind and are not counted.

The reads that remain, per round (vmap engine, every algorithm, evaluation every round):
  simulate._nonfinite_clients    1  one bool: are all clients' new parameters finite (the divergence
                                    guard; the clients' list is read only when some are not)
  evaluate._summaries            1  per served model (global, and pers when personalized): the
                                    metrics.csv row's floats (pooled and per-client mean/std/min/max
                                    and p10/p25/p75 accuracy, pooled and mean loss), one stacked copy
  evaluate.evaluate              1  the row's train_loss float
                                 3-5 `.cpu()` of the per-client metrics for clients.csv (one copy each)
  algorithms.fedpac.head_weights 1  FedPAC only: torch.linalg.eigh of the round's head-mixing QP
                                    matrices (its info check; see fedpac.head_weights for why no
                                    sync-free solver replaces it)
Nothing else in local training, the server step or the engines' passes reads from the device.

torch's FakeTensorMode runs a round's local training and server step with every tensor on a fake
`cuda` device on this CPU-only machine (`test_a_round_runs_on_a_fake_cuda_device`): a CPU tensor
mixed into the device computation raises there, and so does any `.item()` (fake tensors hold no
values). Only for rounds without autograd's engine and forward-mode AD (see FAKE_CUDA): FedAvg,
Per-FedAvg fo/hf and pFedMe on an MLP. Evaluation is not run under it: its metrics are the values
the row must read.
"""
from __future__ import annotations

import collections
import functools
import traceback
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fedrun.simulate
from fedrun.algorithms import build, names
from fedrun.data import synthetic
from fedrun.engine import VmapEngine, params_of
from fedrun.errors import ConfigError
from fedrun.models import MLP, MLPBN
from fedrun.simulate import Schedule, local_training, sample_round, simulate

SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive",
            "equal", "allclose", "_linalg_check_errors", "_linalg_eigh"}
# the reads an algorithm's own server step keeps, per round, each with its reason in the module docstring
OWN_READS = {"fedpac": {("_linalg_eigh", "algorithms.fedpac.head_weights"): 1}}
PYTHON_READS = ("tolist", "cpu", "numpy")
# the folder fedrun's modules are imported from (fedrun is a namespace package: no __file__ of its own)
PACKAGE = Path(fedrun.simulate.__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def _module(filename: str) -> str | None:
    """fedrun/x/y.py -> 'x.y'; None for a file outside the imported package. Relative to the package
    itself, so a checkout in a folder named `fedrun` (or under one, or with spaces in its path)
    counts the same as any other."""
    path = Path(filename).resolve()
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts) if path.is_relative_to(PACKAGE) else None


def _site() -> str:
    """module:function of the innermost frame in fedrun's package that asked."""
    for f in reversed(traceback.extract_stack()[:-2]):
        if (module := _module(f.filename)) is not None:
            return f"{module}.{f.name}"
    return "?"


class SyncCounter(TorchDispatchMode):
    """Counts device-to-host reads by (what, where); see the module docstring for what counts."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()
        self._patched = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = func._opname
        sync = op in SYNC_OPS
        if op == "repeat_interleave" and kwargs.get("output_size") is None:
            sync = True
        if op == "index" and any(t is not None and t.dtype == torch.bool for t in args[1]):
            sync = True
        if sync:
            self.counts[(op, _site())] += 1
        return func(*args, **kwargs)

    def __enter__(self):
        for name in PYTHON_READS:
            orig = getattr(torch.Tensor, name)
            self._patched[name] = orig

            def counted(t, *a, _orig=orig, _name=name, **k):
                site = _site()
                if site != "?":
                    self.counts[(_name, site)] += 1
                return _orig(t, *a, **k)

            setattr(torch.Tensor, name, counted)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, orig in self._patched.items():
            setattr(torch.Tensor, name, orig)
        return super().__exit__(*exc)


@pytest.fixture(scope="module")
def data():
    return synthetic(num_clients=10, dim=6, num_classes=3, seed=1, cache_dir=None, chunk_len=16)


def _count(data, algo_name: str, clients: int, rounds: int, sampling: str = "replacement") -> collections.Counter:
    torch.manual_seed(0)
    model = MLP(6, 3, hidden=[5])
    try:
        build(algo_name).check_params(params_of(model))
    except ConfigError:  # an algorithm that needs BatchNorm (FedBN) gets the MLP with BatchNorm
        torch.manual_seed(0)
        model = MLPBN(6, 3, hidden=[5])
    sched = Schedule(rounds=rounds, tau=2, clients_per_round=clients, batch_size=4, sampling=sampling)
    with SyncCounter() as c:
        simulate(build(algo_name), VmapEngine(model), data, params_of(model), sched, 0)
    return c.counts


def test_the_counter_sees_each_kind_of_read():
    t = torch.arange(4.0)
    with SyncCounter() as c:
        (t.sum().item(), bool(t[0] > 1), t.nonzero(), t[t > 1],
         torch.repeat_interleave(torch.arange(2), torch.tensor([1, 2])))
    assert sorted(op for op, _ in c.counts.elements()) == ["_local_scalar_dense", "_local_scalar_dense", "index",
                                                           "nonzero", "repeat_interleave"]


@pytest.mark.parametrize("algo_name", names())
def test_reads_per_round_do_not_grow_with_the_clients_and_are_the_named_ones(data, algo_name):
    few, many = _count(data, algo_name, 2, 2), _count(data, algo_name, 8, 2)
    assert few == many, (few, many)
    one_round = _count(data, algo_name, 8, 1)
    per_round = many - one_round  # round 2 alone
    served = per_round[("tolist", "evaluate._summaries")]
    assert served in (1, 2)
    expected = {("_local_scalar_dense", "simulate._nonfinite_clients"): 1,
                ("tolist", "evaluate._summaries"): served,
                ("_local_scalar_dense", "evaluate.evaluate"): 1,
                ("cpu", "evaluate.<dictcomp>"): 1 + 2 * served, **OWN_READS.get(algo_name, {})}
    assert dict(per_round) == expected


@pytest.mark.parametrize("sampling", ["epochs", "steps"])
def test_the_other_samplings_add_no_read_per_client(data, sampling):
    few, many = _count(data, "perfedavg", 2, 2, sampling), _count(data, "perfedavg", 8, 2, sampling)
    assert few == many, (few, many)


def _to(tree, device):
    from fedrun.engine.tree import tree_map

    return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, tree)


# Rounds that need neither autograd's engine nor forward-mode AD: the MLP's hand-written backward.
# On fake cuda tensors without a GPU, torch 2.14's autograd engine calls the CUDA runtime and fails
# ("hasPrimaryContext expects a valid device index"), and jvp (Per-FedAvg exact's HVP) mixes meta and
# cuda fake tensors (FakeTensorDeviceMismatchError): FedDyn, SCAFFOLD, paper 004's algorithms, the
# exact variant and every CNN round cannot run under FakeTensorMode here.
FAKE_CUDA = [("fedavg", {}), ("perfedavg", {"variant": "fo"}), ("perfedavg", {"variant": "hf"}), ("pfedme", {})]


@pytest.mark.parametrize("algo_name,opts", FAKE_CUDA, ids=[f"{a}-{o}" for a, o in FAKE_CUDA])
def test_a_round_runs_on_a_fake_cuda_device(algo_name, opts):
    """Local training and the server step of one round, every tensor a FakeTensor on `cuda` (no
    GPU needed): a CPU tensor mixed into the device computation, or a read of a value, raises."""
    model_name = "mlp"
    import dataclasses

    from torch._subclasses.fake_tensor import FakeTensorMode

    from fedrun.bench import agreement

    data = agreement.data_of(model_name, torch.float32, "cpu")
    torch.manual_seed(0)
    model = agreement.MODELS[model_name](data)
    algo = build(algo_name, **{**agreement.declared_options(algo_name), **opts})
    sched = Schedule(rounds=1, tau=2, clients_per_round=2, batch_size=3)
    state = algo.init(params_of(model), data.num_clients)
    clients, trained, idx = sample_round(data, sched, algo.batches_per_step, 0, 1, algo.train_all)
    with FakeTensorMode(allow_non_fake_inputs=True):
        fdata = data.to("cuda")
        fstate = dataclasses.replace(state, **{f.name: _to(getattr(state, f.name), "cuda")
                                               for f in dataclasses.fields(state)})
        engine = VmapEngine(model)  # (the engine calls the model with the parameters it is given)
        ftrained, fidx = trained.to("cuda"), idx.to("cuda")
        local = algo.client_init(fstate, ftrained, 1)
        local = local_training(algo, engine, local, fdata, fidx, 1)
        selected = torch.searchsorted(ftrained, clients.to("cuda"))
        new = algo.server_update(fstate, local, ftrained, selected, None)
    assert all(v.device.type == "cuda" for v in new.params.values())

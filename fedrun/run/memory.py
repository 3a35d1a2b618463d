"""The `memory=` option: a run's stacked computations fitted to the device's memory.

fedrun trains a round's clients as one stacked computation and scores every client in a few large
vmapped calls; unplanned, the CIFAR-10 ACID preset (100 devices) peaked at 21.6 GB of an H200 and the
CIFAR bench at 57.9 GB, most of it in evaluation. Before the first round, `plan` MEASURES what the
run's own computations cost on its device, on its own first-round draws:

  - local training of 1 and of 2 clients (the algorithm's whole round of local steps): a fixed part and
    a part per client;
  - a full pass (evaluation, `full_grad`) over 1 and PROBE_CHUNKS row chunks with per-client
    parameters: a fixed part and a part per chunk (`data.chunk_len` rows);

(CUDA: `torch.cuda.max_memory_allocated` over each probe; elsewhere the bytes of the tensors the probe
allocates, counted by `AllocationMeter`), and picks the most clients trained at once and the most row
chunks per full-pass call that fit the budget after what stays resident (the data, the engine's
cached chunk view, the round's client states). The probes' results are dropped: every round, the first
included, runs with the planned sizes, so where a run starts (fresh or resumed) does not change how
its sums are split. A plan that still runs out of memory (the allocator's fragmentation, a pass the
probes did not cover) falls back on halving: the clients of a round (`simulate.ChunkedTraining`) and
the chunks of a full pass (`simulate._evaluate_fitted`), each retried from its pure inputs.

The probes run with the algorithm bound to the run (`Algorithm.bind`, as simulate_group binds it)
on `init`'s state, and BEFORE `prepare`, which cannot come first:
its own work over every training client (FedDBE's round before round 1) runs in the chunks planned
here (`EvalContext.chunked`; `Plan.clients` bounds those chunks too, each holding its clients'
states), a resumed run never calls it and is planned as the uninterrupted one was, and it sets
values of the tensors `init` made, not their shapes (tests/test_memory.py), so
the probes cost the same on either state.

Chunked and all-at-once runs compute the same sums split differently: the same numbers up to float
rounding (tests/test_memory.py: parameters within rtol 1e-6, atol 1e-7, metrics within rel 1e-5), so
`memory` is one of the options that never enter a run's fingerprint (fedrun.config.NEUTRAL_OPTIONS).
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..algorithms.base import Algorithm, RunInfo
from ..data.federated import ClientSplit, FederatedData
from ..engine import Engine, Params
from ..engine.tree import tree_leaves, tree_map
from ..errors import ConfigError
from ..simulate import Schedule, clients_slice, is_oom, local_training, round_draws

GB = 2**30
MEMORY_HELP = "auto, or a number of GB > 0 (e.g. memory=8)"
# memory=auto on a GPU: its free memory less this margin (the CUDA context, cuBLAS/cuDNN workspaces and
# the caching allocator's rounding live outside the tensors the probes measure)
CUDA_MARGIN = 0.08  # of the device's total memory, and at least
CUDA_MARGIN_MIN = 1 * GB
# the share of what is left for the stacked computations that a plan fills (peaks measured on one or
# two clients extrapolate linearly; this leaves room for the allocator's fragmentation)
FILL = 0.8
# row chunks in the second full-pass probe (the first has 1)
PROBE_CHUNKS = 8


def size(n: float) -> str:
    """Bytes as GB (or MB below 1 GB), three significant digits."""
    return f"{n / GB:.3g} GB" if abs(n) >= GB else f"{n / 2**20:.3g} MB"


def parse_memory(option) -> float | None:
    """`memory=`: None for auto, else the budget in GB. One-line ConfigError otherwise."""
    if option is None or option == "auto":
        return None
    if isinstance(option, (int, float)) and not isinstance(option, bool) and math.isfinite(option) and option > 0:
        return float(option)
    raise ConfigError(f"memory={option!r} is not allowed; choose one of: {MEMORY_HELP}")


def budget_bytes(option, device: torch.device) -> int | None:
    """The bytes a run's tensors may occupy on `device`, or None for no cap.

    memory=auto: on a CUDA device, what this process holds now plus the device's free memory, less
    CUDA_MARGIN of its total (at least CUDA_MARGIN_MIN); on the CPU no cap, as before: the CPU path
    already works in bounded pieces (full passes in groups of at most VmapEngine.CPU_GROUP_ROWS rows,
    convolutional models client by client), a plan would make the numbers depend on how much memory
    the machine has free, and the operating system swaps before it refuses. memory=N: N GB anywhere
    (on the CPU, the tensors a probe allocates are counted, see `AllocationMeter`).
    """
    gb = parse_memory(option)
    if gb is not None:
        return int(gb * GB)
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(cuda_index(device))
    # the blocks this process's caching allocator holds (reserved) are its own to reuse, allocated or not
    return int(torch.cuda.memory_reserved(device) + free - max(CUDA_MARGIN * total, CUDA_MARGIN_MIN))


def cuda_index(device: torch.device) -> int:
    """The CUDA device's index (`cuda` alone: the current one), which mem_get_info and
    set_per_process_memory_fraction need."""
    return torch.cuda.current_device() if device.index is None else device.index


class AllocationMeter(TorchDispatchMode):
    """Counts the bytes of the tensors that operations allocate while it is active, and their peak:
    an allocator's view for devices without allocator statistics (the CPU). Outputs that share
    storage with an input (views, in-place results) are not new memory; a storage is counted until
    it is freed. With `limit`, an allocation that takes the live bytes past it raises
    torch.OutOfMemoryError, as a device of that size would (tests/test_memory.py enforces a budget
    with it); `refused` counts those."""

    def __init__(self, limit: int | None = None):
        super().__init__()
        self.limit = limit
        self.live = self.peak = self.refused = 0
        self._sizes: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            s = t.untyped_storage()
            key, n = s.data_ptr(), s.nbytes()
            if n == 0 or key in inputs or key in self._sizes:
                continue
            self._sizes[key] = n
            self.live += n
            weakref.finalize(s, self._free, key)
            if self.limit is not None and self.live > self.limit:
                self.refused += 1
                raise torch.OutOfMemoryError(f"out of memory: {self.live} bytes live past the budget of {self.limit} "
                                             f"(fedrun.run.memory.AllocationMeter)")
            self.peak = max(self.peak, self.live)
        return out

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """The most memory `fn()` holds at once beyond what was allocated before it (its result dropped)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    with AllocationMeter() as meter:
        fn()
    return meter.peak


def tensor_bytes(*trees) -> int:
    """The bytes of the distinct storages of the tensors in `trees` (dataclasses: their fields)."""
    seen: dict[int, int] = {}
    for tree in trees:
        leaves = tree_leaves(tree if not hasattr(tree, "__dataclass_fields__")
                             else [getattr(tree, f) for f in tree.__dataclass_fields__])
        for t in leaves:
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


@dataclass
class Plan:
    """What `plan` measured and chose (bytes; None: no cap)."""

    budget: int | None
    resident: int = 0  # data, cached chunk views, the round's client states
    train_fixed: int = 0
    train_per_client: int = 0
    eval_fixed: int = 0
    eval_per_chunk: int = 0
    clients: int | None = None  # clients trained at once (None: all), in a round and in `prepare`
    chunks: int | None = None  # row chunks per full-pass call (None: the engine's own)

    def line(self) -> str:
        """One line for the log: the budget and the sizes chosen."""
        if self.budget is None:
            return "memory: no cap (all clients at once, full passes of max_chunks chunks)"
        clients = "all" if self.clients is None else self.clients
        chunks = "all" if self.chunks is None else self.chunks
        return (f"memory: budget {size(self.budget)}, resident {size(self.resident)}; training "
                f"{size(self.train_fixed)} + "
                f"{size(self.train_per_client)}/client -> {clients} clients at once; full passes "
                f"{size(self.eval_fixed)} + {size(self.eval_per_chunk)}/chunk -> {chunks} chunks per call")


def _split_head(split: ClientSplit, chunks: int) -> ClientSplit:
    """The split with only its first `chunks` row chunks (a full pass over them: the probe's)."""
    return ClientSplit(split.x, split.y, split.offsets, split.sizes, split.chunk_idx[:chunks],
                       split.chunk_mask[:chunks], split.chunk_client[:chunks])


def _linear(p1: int, p2: int, units: int = 2) -> tuple[int, int]:
    """(fixed, per unit) from the peaks of 1 and of `units` units. A peak that does not grow with the
    units (0 per unit) is a computation that goes unit by unit anyway: the loop engine's clients, the
    CPU's per-client passes of a convolutional model (VmapEngine._conv_on_cpu)."""
    per = -(-max(p2 - p1, 0) // (units - 1))
    return max(p1 - per, 0), per


def _or_full(probe: Callable[[], int], p1: int, room: float) -> int:
    """The second probe's peak, or, where it ran out of memory, one that leaves room for one unit."""
    try:
        return probe()
    except RuntimeError as e:
        if not is_oom(e):
            raise
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return p1 + max(int(room), p1)


def _fit(room: float, fixed: int, per: int, most: int) -> int:
    """How many units fit in `room` bytes (`most` when the cost does not grow with them; 0: none)."""
    if room < fixed or room <= 0:
        return 0
    return most if per == 0 else int((room - fixed) // per)


def plan(algo: Algorithm, engine: Engine, data: FederatedData, sched: Schedule, params: Params, seed: int,
         budget: int | None, replicas: int = 1, steps: Callable = local_training, client_chunk: int | None = None,
         what: str = "the model", option=None) -> Plan:
    """Measures the run's costs (see the module docstring) and chooses how many clients train at once
    and how many row chunks a full pass takes, within `budget` bytes. Sets `engine.max_chunks` to the
    chunks chosen. Raises a one-line ConfigError naming `what` (the model), the batch and the budget
    when not even one client (or one row chunk) fits.

    Args:
        replicas: seeds trained together (their clients stack).
        client_chunk: clients at once fixed by the user (then only the full passes are planned).
        what: the model, as the error names it; option: the `memory=` value the error names (None: auto).
    """
    if budget is None:
        return Plan(None)
    device = data.train.x.device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # (the run's random state
        return _plan(algo, engine, data, sched, params, seed, budget, replicas, steps, client_chunk, what,  # stays)
                     option)


def _plan(algo: Algorithm, engine: Engine, data: FederatedData, sched: Schedule, params: Params, seed: int,
          budget: int, replicas: int, steps: Callable, client_chunk: int | None, what: str, option) -> Plan:
    """`plan` with a budget: the probes on round 1's draws, then the sizes that fit."""
    device = data.train.x.device
    # On CUDA the first call of a kernel may allocate workspaces that stay (cuBLAS, cuDNN): one warm-up
    # call of each probe first, so they count as resident and not as the first probe's unit.
    warm = device.type == "cuda"
    # (bound as simulate_group binds it: what the round's work is sized by, FedALA's and FedFomo's tau steps,
    # APPLE's p0)
    algo = algo.bind(RunInfo.of(sched, data, algo.optim, algo.bn))
    state = algo.init(params, data.num_clients)
    _, trained, idx, aug = round_draws(algo, data, sched, seed, 1)
    local = algo.start_local(state, trained, 1)
    m = len(trained) * replicas
    per_state = tensor_bytes(clients_slice(local, 0, 1))
    views = [s.chunk_idx.numel() * s.x[0].numel() * s.x.element_size() for s in (data.train, data.test)]
    cached = sum(v for v in views if v <= getattr(engine, "CACHE_BYTES", 0))  # (the engine keeps small chunk views)
    out = Plan(budget, tensor_bytes(data.train, data.test) + cached + tensor_bytes(state) + m * per_state)

    def room() -> float:
        """What a plan may fill: FILL of the budget less the resident bytes (on CUDA at least what the
        process holds there now: every seed's model, the warm-up's workspaces, ...)."""
        if warm:
            out.resident = max(out.resident, torch.cuda.memory_allocated(device) + m * per_state)
        return (budget - out.resident) * FILL

    def train(k: int) -> int:
        part = clients_slice(local, 0, k)
        return peak_bytes(lambda: steps(algo, engine, part, data, clients_slice(idx, 0, k), 1,
                                        None if aug is None else clients_slice(aug, 0, k)), device)

    batch = f"batch_size={sched.batch_size}, tau={sched.tau}"
    given = f"memory={'auto' if option in (None, 'auto') else option} ({size(budget)})"

    def budget_txt() -> str:
        return (f"{given} leaves {size(max(room(), 0))} (80% of what {size(out.resident)} resident: data, model, "
                f"client states, leave)")
    if client_chunk is None:
        try:
            p1 = train(1) if not warm else (train(1), train(1))[1]
        except RuntimeError as e:  # (torch.OutOfMemoryError is one)
            if not is_oom(e):
                raise
            raise ConfigError(f"{what} with {batch} ran out of device memory training one client; {budget_txt()}; "
                              f"allowed: a larger memory= or a smaller batch_size") from None
        out.train_fixed, out.train_per_client = (_linear(p1, _or_full(lambda: train(2), p1, room())) if m >= 2
                                                 else (0, p1))
        fit = _fit(room(), out.train_fixed, out.train_per_client, m)
        if fit < 1:
            raise ConfigError(f"{what} with {batch} needs {size(p1)} to train one client; {budget_txt()}; "
                              f"allowed: a larger memory= or a smaller batch_size")
        out.clients = fit if fit < m else None
        n = data.num_train_clients
        if out.clients is None and n > m:  # `prepare`'s work over every training client (FedDBE's round
            # before round 1) goes in the same chunks (EvalContext.chunked), each holding its own clients'
            # states, where the round's m states were counted as resident
            more = _fit(room() + FILL * m * per_state, out.train_fixed, out.train_per_client + per_state, n)
            out.clients = max(more, m) if more < n else None

    split = max(data.train, data.test, key=lambda s: s.chunk_idx.shape[1])  # (the longer chunks: the probe's)
    chunks = len(split.chunk_idx)
    stacked = tree_map(lambda v: v.unsqueeze(0).expand(data.num_clients, *v.shape), algo.eval_params(state))

    def full_pass(k: int) -> int:
        head = _split_head(split, k)
        try:
            with torch.no_grad():
                cost = peak_bytes(lambda: engine.evaluate(stacked, head, False), device)
            if not engine.batchnorm:  # the personalizations' full-batch gradients (a BatchNorm model has none)
                cost = max(cost, peak_bytes(lambda: engine.full_grad(stacked, head, False), device))
        finally:  # (the engine keeps small splits' chunk views by the split's id)
            getattr(engine, "_chunk_x", {}).pop(id(head), None)
        return cost

    saved = engine.max_chunks
    k = min(PROBE_CHUNKS, chunks, saved)
    engine.max_chunks = 1  # (the probe's groups: 1 chunk, then k; a chunk's own cost can be small beside
    try:                   # the per-client sums a full pass allocates once, so k > 2 makes it show)
        try:
            p1 = full_pass(1) if not warm else (full_pass(1), full_pass(1))[1]
        except RuntimeError as e:
            if not is_oom(e):
                raise
            raise ConfigError(f"{what} ran out of device memory in a full pass over one chunk of "
                              f"{split.chunk_idx.shape[1]} rows; {budget_txt()}; allowed: a larger memory= or a "
                              f"smaller data.chunk_len") from None
        engine.max_chunks = k
        out.eval_fixed, out.eval_per_chunk = _linear(p1, _or_full(lambda: full_pass(k), p1, room()), k) if k > 1 \
            else (0, p1)
    finally:
        engine.max_chunks = saved
    fit = _fit(room(), out.eval_fixed, out.eval_per_chunk, saved)
    if fit < 1:
        raise ConfigError(f"{what} needs {size(p1)} for a full pass over one chunk of "
                          f"{split.chunk_idx.shape[1]} rows; {budget_txt()}; allowed: a larger "
                          f"memory= or a smaller data.chunk_len")
    if fit < saved:
        out.chunks = engine.max_chunks = fit
    return out

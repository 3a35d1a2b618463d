"""THE round loop: sample clients, local steps for all of them at once, server step, evaluate, log."""
from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
import torch

from .algorithms.base import Algorithm, EvalContext, Local, Phase, RunInfo, ServerState
from .clock import RoundClock, RoundReporter
from .data.augment import apply_augmentation, draw_augmentation
from .data.federated import FederatedData
from .engine import Engine, Params
from .engine.tree import tree_leaves, tree_map
from .engine.work import cat_clients, clients_slice, steps_by_work
from .evaluate import Evaluation, evaluate


class Diverged(RuntimeError):
    """A loss or parameter became NaN or inf."""


def round_generator(seed: int, rnd: int, stream: int = 0) -> torch.Generator:
    """CPU generator for (seed, round, stream): the same on every device and engine.
    Stream 0 draws the round's clients and minibatches, stream 1 the test-time adaptation batches,
    stream 2 the training batches' augmentation."""
    state = np.random.SeedSequence([seed, rnd, stream]).generate_state(2, dtype=np.uint64)
    return torch.Generator().manual_seed(int(state[0] >> np.uint64(1)))


# How a round's training minibatches take a client's rows (README "What a run writes"): replacement
# (uniform, with replacement), epochs (shuffled passes through the round, like a shuffling
# DataLoader), steps (each step's batches: distinct rows of a fresh shuffle).
SAMPLING = ("replacement", "epochs", "steps")


@dataclass
class Schedule:
    rounds: int
    tau: int
    clients_per_round: int
    batch_size: int
    eval_every: int = 1
    personalize_batch: int | None = None  # None: personalize on all training rows
    aggregate: str = "uniform"  # uniform | samples (weights = clients' numbers of training rows)
    sampling: str = "replacement"  # training minibatch rows: replacement | epochs | steps (SAMPLING)

    def __post_init__(self):
        if self.sampling not in SAMPLING:
            raise ValueError(f"sampling={self.sampling!r} is not allowed; choose one of: {', '.join(SAMPLING)}")


def eval_context(data: FederatedData, sched: Schedule, seed: int, rnd: int) -> EvalContext:
    """Test-time adaptation of round `rnd` draws its minibatches from its own random stream, so it
    never shifts the training draws."""
    return EvalContext(data, round_generator(seed, rnd, stream=1), sched.batch_size, sched.tau, sched.personalize_batch,
                       passes=context_passes)


def context_passes(ctx: EvalContext, engine: Engine, step: Callable, start: Callable, clients: torch.Tensor,
                   epochs: int, out: Callable):
    """`EvalContext.train_passes` (FedDBE's round before round 1 in local epochs): the rows of an epochs
    phase of `epochs` passes (`draw_passes`, its pass as long as the largest training client's) drawn
    for all `clients` from `ctx.gen`, then `_epochs_by_work` from `start(cs)` in `ctx.chunked`'s chunks.
    A pass is as long as the largest of `clients`' (all training clients: the round's pass length)."""
    data = ctx.data
    held = data.train.sizes.cpu()
    sizes = torch.zeros_like(held)
    sizes[clients.cpu()] = held[clients.cpu()]
    idx, live, per_pass = draw_passes(data.train, sizes, clients.cpu(), Phase(step, epochs=epochs), ctx.batch_size,
                                      ctx.gen)
    d = PhaseDraw(idx, live, None, per_pass)

    def run(cs: torch.Tensor, d: PhaseDraw):
        return out(_epochs_by_work(None, engine, start(cs), data, d, 0, step, epochs))

    return ctx.chunked(run, clients, d)


def sample_round(data: FederatedData, sched: Schedule, k: int, seed: int, rnd: int, train_all: bool = False):
    """The round's sampled clients [s], the clients that train [m] (the sampled ones, or all with
    `train_all`), and row indices [m, tau, k, B] of every minibatch of the round, drawn as
    `sched.sampling` says."""
    g = round_generator(seed, rnd)
    clients = _round_clients(data, sched, g)
    shape = (sched.tau, k, sched.batch_size)
    return _with_rest(data, clients, lambda cs: _draw_rows(data.train, sched.sampling, cs, shape, g), train_all)


def _round_clients(data: FederatedData, sched: Schedule, g: torch.Generator) -> torch.Tensor:
    # held-out clients never
    return torch.randperm(data.num_train_clients, generator=g)[: sched.clients_per_round].sort().values


def _draw_rows(split, sampling: str, cs: torch.Tensor, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Row indices [len(cs), *shape] (shape: steps, k, B) drawn as `sampling` says."""
    if sampling == "epochs":  # the round walks shuffled passes over the client's rows
        return split.shuffled_indices(cs, 1, math.prod(shape), g).view(len(cs), *shape)
    if sampling == "steps":  # each step's k batches: distinct rows of a fresh shuffle
        return split.shuffled_indices(cs, shape[0], math.prod(shape[1:]), g).view(len(cs), *shape)
    return split.sample_indices(cs.to(split.x.device), torch.rand(len(cs), *shape, generator=g).to(split.x.device))


def _with_rest(data: FederatedData, clients: torch.Tensor, draw: Callable, train_all: bool = False):
    """(clients, trained, draws) with `draw(cs)` (a tensor, or a tree of them, leading dim = clients)
    for the sampled clients, then, with `train_all`, for the others (so the sampled clients train on
    the same batches either way)."""
    out = draw(clients)
    trained = clients
    if train_all:
        trained = torch.arange(data.num_train_clients)
        rest = torch.ones(len(trained), dtype=torch.bool)
        rest[clients] = False
        others = draw(trained[rest])

        def merge(mine, theirs):
            full = torch.empty(len(trained), *mine.shape[1:], dtype=mine.dtype, device=mine.device)
            full[clients.to(mine.device)] = mine
            full[rest.to(mine.device)] = theirs
            return full
        out = tree_map(merge, out, others)
    dev = data.train.x.device
    return clients.to(dev), trained.to(dev), out


class PhaseDraw(NamedTuple):
    """One phase's minibatches for a round's clients: row indices [m, S, k, B], which steps each
    client takes (`live` [m, S] bool; None: all S) and the augmentation params of the rows (or None)."""

    idx: torch.Tensor
    live: torch.Tensor | None
    aug: tuple | None = None
    per_pass: torch.Tensor | None = None  # an epochs phase: each client's steps per pass [m] (host)


def sample_phases(data: FederatedData, sched: Schedule, phases: tuple[Phase, ...], seed: int, rnd: int,
                  train_all: bool = False):
    """`sample_round` for a round of `phases` (Algorithm.phases): the same clients, then per phase in
    order a PhaseDraw (its aug None). A `steps` phase draws its [m, steps, k, B] as `sched.sampling`
    says; an `epochs` phase walks `epochs` fresh shuffles of each client's rows, client c taking
    floor(n_c / B) minibatches of each (distinct rows, the partial last one dropped). Its S is
    `epochs` x the largest such count among ALL training clients, so a round's shapes are the same
    every round (and for every seed); `live` marks each client's own steps."""
    g = round_generator(seed, rnd)
    clients = _round_clients(data, sched, g)
    split, B = data.train, sched.batch_size
    sizes = None
    if any(ph.epochs is not None for ph in phases):  # only epochs phases read the sizes (a host read)
        sizes = split.sizes.cpu()[: data.num_train_clients]

    def draw(cs: torch.Tensor) -> tuple:
        out = []
        for ph in phases:
            if ph.epochs is None:
                out.append((_draw_rows(split, sched.sampling, cs, (ph.steps, ph.batches, B), g), None, None))
                continue
            out.append(draw_passes(split, sizes, cs, ph, B, g))
        return tuple(out)

    clients, trained, out = _with_rest(data, clients, draw, train_all)
    return clients, trained, tuple(PhaseDraw(idx, live, None, per_pass) for idx, live, per_pass in out)


def draw_passes(split, sizes: torch.Tensor, cs: torch.Tensor, ph: Phase, B: int, g: torch.Generator) -> tuple:
    """An epochs phase's rows for the clients `cs`: (idx [m, S, k, B], live [m, S], per_pass [m] (host)),
    `ph.epochs` fresh shuffles of each client's rows, client c taking floor(n_c / B) minibatches of each
    (`sample_phases`); S is `ph.epochs` x the largest such count among `sizes` (the host-known sizes of
    ALL training clients)."""
    k = ph.batches
    # [C] steps per epoch (host-known): floor(n_c / B), or with disjoint batches floor(n_c / (k B))
    per_pass = sizes // (k * B if ph.disjoint else B)
    longest = int(per_pass.max())
    m, S = len(cs), ph.epochs * longest
    if S == 0:  # no client has a whole minibatch: the phase trains nothing
        return (torch.zeros(m, 0, k, B, dtype=torch.long, device=split.x.device),
                torch.zeros(m, 0, dtype=torch.bool, device=split.x.device), per_pass[cs])
    # each pass's rows client c reads (its steps; the rows past them, not sorted, only masked steps read)
    if k == 1 or ph.disjoint:  # (disjoint: a step's k minibatches are consecutive rows of the pass)
        idx = split.shuffled_indices(cs, ph.epochs, longest * k * B, g, per_pass[cs] * k * B).view(m, S, k, B)
    else:  # k independent shuffles per pass, a step takes one minibatch of each
        idx = split.shuffled_indices(cs, ph.epochs * k, longest * B, g, per_pass[cs] * B).view(
            m, ph.epochs, k, longest, B)
        idx = idx.transpose(2, 3).reshape(m, S, k, B)
    live = (torch.arange(longest).view(1, 1, -1) < per_pass[cs].view(-1, 1, 1)).expand(m, ph.epochs, longest)
    return idx, live.reshape(m, S).to(split.x.device), per_pass[cs]


def round_draws(algo: Algorithm, data: FederatedData, sched: Schedule, seed: int, rnd: int):
    """(clients, trained, idx, aug) of one replica's round, as `local_training` takes them: for the
    usual round (`algo.phases()` None) idx [m, tau, k, B] of `sample_round` and its augmentation
    params; for a round of phases, idx is a tuple of PhaseDraw (each with its augmentation) and aug None.
    Augmentation params come from stream 2 of (seed, round)."""
    phases = algo.phases()
    gen = round_generator(seed, rnd, stream=2)
    if phases is None:
        clients, trained, idx = sample_round(data, sched, algo.batches_per_step, seed, rnd, algo.train_all)
        return clients, trained, idx, draw_augmentation(data.augment, tuple(idx.shape), gen)
    clients, trained, draws = sample_phases(data, sched, phases, seed, rnd, algo.train_all)
    return clients, trained, tuple(d._replace(aug=draw_augmentation(data.augment, tuple(d.idx.shape), gen))
                                   for d in draws), None


def one_step(algo: Algorithm, engine: Engine, local: Local, data: FederatedData, idx: torch.Tensor, rnd: int,
             aug: tuple | None = None, fn: Callable | None = None, live: torch.Tensor | None = None) -> Local:
    """One local step for all training clients: gather every client's batches `idx` [m, k, B] in one
    op, augment them with the step's pre-drawn `aug` params when the data has an augmentation, and
    call the algorithm's `client_step` (or a phase's step `fn`); with `live` [m] bool, the clients
    whose phase is over keep their Local as it was (what `compile=default` compiles)."""
    xb, yb = data.train.rows(idx)
    if aug is not None:
        xb = apply_augmentation(data.augment, xb, aug, data.augment_fill)
    new = (fn or algo.client_step)(engine, local, [(xb[:, j], yb[:, j]) for j in range(idx.shape[1])], rnd)
    if live is None:
        return new
    return tree_map(lambda n, o: n if n is o else torch.where(live.view(-1, *[1] * (n.dim() - 1)), n, o), new, local)


def local_training(algo: Algorithm, engine: Engine, local: Local, data: FederatedData, idx, rnd: int,
                   aug: tuple | None = None, step: Callable | None = None) -> Local:
    """The round's local steps for all training clients (`one_step` each, or `step`: its compiled
    form): tau of them for idx [m, tau, k, B], or, for idx a tuple of PhaseDraw (`round_draws`),
    each of `algo.phases()` in turn for its own steps."""
    by_work = step is None  # (a compiled step keeps one shape: the masked steps)
    step = step or one_step
    if isinstance(idx, torch.Tensor):
        for s in range(idx.shape[1]):
            # (contiguous: a compiled step's guards would otherwise see a new stride each step)
            local = step(algo, engine, local, data, idx[:, s].contiguous(), rnd,
                         None if aug is None else tuple(a[:, s].contiguous() for a in aug))
        return local
    for phase, d in zip(algo.phases(), idx, strict=True):
        if by_work and d.per_pass is not None and d.idx.shape[1]:
            local = _epochs_by_work(algo, engine, local, data, d, rnd, phase.step, phase.epochs)
            continue
        for s in range(d.idx.shape[1]):
            local = step(algo, engine, local, data, d.idx[:, s].contiguous(), rnd,
                         None if d.aug is None else tuple(a[:, s].contiguous() for a in d.aug),
                         phase.step, None if d.live is None else d.live[:, s].contiguous())
    return local


def _epochs_by_work(algo: Algorithm, engine: Engine, local: Local, data: FederatedData, d: PhaseDraw, rnd: int,
                    fn: Callable, epochs: int) -> Local:
    """An epochs phase (`epochs` passes) whose cost follows the work done (`steps_by_work`: the clients
    sorted by their steps per pass, each step computing only those still training; a round costs the
    sum of its clients' steps, not clients x the largest client's). A pass of the draw is S / epochs
    steps (set by ALL training clients, `draw_passes`), however few of them `d` holds."""
    def step(local: Local, draw: tuple) -> Local:
        return one_step(algo, engine, local, data, draw[0], rnd, draw[1], fn)
    return steps_by_work(local, (d.idx, d.aug), d.per_pass, epochs, step)


def is_oom(e: BaseException) -> bool:
    """Whether `e` is the device running out of memory (torch's error, or a backend's message)."""
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def _free_cached() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class ChunkedTraining:
    """Local training of a round's clients in chunks of at most `size` clients.

    `size=None` starts with all clients at once (`start`: with that many, as fedrun.run.memory planned)
    and, when the stacked computation runs out of device memory, halves the chunk and retries (local
    training is a pure function of its inputs, so a retry gives the same result); the size that fit
    is kept for later rounds. A given `size` is fixed (client_chunk=).
    """

    def __init__(self, size: int | None = None, steps: Callable = local_training, start: int | None = None):
        self.fixed = size is not None
        self.size = size if self.fixed else start
        self.steps = steps  # local_training, or an acceleration.LocalSteps (compile=, precision=)

    def __call__(self, algo: Algorithm, engine: Engine, local: Local, data: FederatedData, idx: torch.Tensor, rnd: int,
                 aug: tuple | None = None) -> Local:
        return self.map(lambda i, l, a: self.steps(algo, engine, l, data, i, rnd, a), idx, local, aug)

    def map(self, fn: Callable, *trees):
        """`fn(*trees)` for the clients of `trees` (each a tree whose leaves lead with the same clients,
        or None), a chunk of them at a time, the chunks' results (leading with their clients) joined:
        the round's local training, and any other work over many clients that is a pure function of
        its inputs (FedDBE's round before round 1: `EvalContext.chunked`)."""
        m = tree_leaves(trees[0])[0].shape[0]  # (trees[0]: idx, a tensor or a tuple of PhaseDraw)
        while True:
            size = min(self.size or m, m)
            try:
                parts = [fn(*(clients_slice(t, i, i + size) for t in trees)) for i in range(0, m, size)]
                break
            except RuntimeError as e:  # torch.OutOfMemoryError is a RuntimeError
                if self.fixed or size == 1 or not is_oom(e):
                    raise
                parts = None
                self.size = (size + 1) // 2
                _free_cached()
        if len(parts) == 1:
            return parts[0]
        return tree_map(lambda *vs: torch.cat(vs), *parts)


@dataclass
class Progress:
    """Where a run stands: the state after `round` rounds and the models transmitted so far."""

    state: ServerState
    round: int = 0
    transmitted: int = 0


@dataclass
class Replica:
    """One run of a group that `simulate_group` trains as one computation with the others: the same
    algorithm, data and schedule, its own seed (initial params, sampled clients, minibatches,
    evaluation draws), state and callbacks. `at`, `done`, `last` and `error` are filled in as it runs:
    `done` is `at` once the round's evaluation and callbacks have all finished (what an interrupt
    may checkpoint: `at` moves on before its round is evaluated)."""

    seed: int
    params: Params
    start: Progress | None = None
    on_eval: Callable[[int, int, Evaluation], None] | None = None
    on_checkpoint: Callable[[Progress], None] | None = None
    checkpoint_due: Callable[[], bool] | None = None  # also checkpoint after a round when this says so (e.g. by time)
    at: Progress | None = None
    done: Progress | None = None
    last: Evaluation | None = None
    error: Diverged | None = None


def simulate(
    algo: Algorithm,
    engine: Engine,
    data: FederatedData,
    params: Params,
    sched: Schedule,
    seed: int,
    on_eval: Callable[[int, int, Evaluation], None] | None = None,
    progress: bool = False,
    start: Progress | None = None,
    on_checkpoint: Callable[[Progress], None] | None = None,
    checkpoint_every: int = 0,
    client_chunk: int | None = None,
    steps: Callable | None = None,
    start_chunk: int | None = None,
) -> tuple[ServerState, Evaluation | None]:
    """Runs rounds up to `sched.rounds`, evaluating every `eval_every` rounds and after the last.

    Args:
        start: resume from this point instead of `algo.init(params)` at round 0. Every round's
            randomness derives from (seed, round) alone, so a resumed run repeats exactly.
        on_checkpoint: called every `checkpoint_every` rounds (0: never) and after the last round,
            after that round's evaluation was reported.
        client_chunk: train at most this many clients at once (None: all, split on out-of-memory).
        steps: how the local steps run (`acceleration.LocalSteps`: compile=, precision=; None: eager).
        start_chunk: without `client_chunk`, train this many clients at once from the first round
            (fedrun.run.memory's plan; still halved on out-of-memory).
    Returns the final server state and the last evaluation.
    """
    run = Replica(seed, params, start, on_eval, on_checkpoint)
    simulate_group(algo, engine, data, [run], sched, progress, checkpoint_every, client_chunk, steps, start_chunk)
    if run.error is not None:
        raise run.error
    return run.at.state, run.last


def simulate_group(
    algo: Algorithm,
    engine: Engine,
    data: FederatedData,
    runs: list[Replica],
    sched: Schedule,
    progress: bool = False,
    checkpoint_every: int = 0,
    client_chunk: int | None = None,
    steps: Callable | None = None,
    start_chunk: int | None = None,
    clock: RoundClock | None = None,
) -> None:
    """Runs several replicas (seeds) of one configuration as one computation: each round, every
    replica samples its own clients and minibatches from its own (seed, round) streams, and the
    clients of all replicas train together, stacked along the client dimension (so `client_chunk`
    and the out-of-memory halving bound them all at once). Server updates, evaluation and
    callbacks are per replica. A replica's numbers are those of `simulate` with its seed alone.

    Replicas may start at different rounds (resumed from different checkpoints); each joins when
    the loop reaches its round. A replica that diverges stops with its `error` set; the others go on.
    After the first rounds, one line on stderr estimates the time left (fedrun.clock.RoundReporter).
    `clock`: the RoundClock the rounds' seconds go to (the caller reads them after: scripts/baselines.py
    --plan); None: one of its own.
    """
    algo = algo.bind(RunInfo.of(sched, data, algo.optim, algo.bn))  # (the run's facts; its recipe as bound)
    train = ChunkedTraining(client_chunk, steps or local_training, start_chunk)
    for r in runs:  # (`prepare`'s own work over many clients goes in the round's chunks: train.map)
        if r.start:
            r.at = r.done = r.start
            continue
        ctx = eval_context(data, sched, r.seed, 0)
        ctx.chunked = train.map  # (set, not dataclasses.replace: a context subclass keeps its own __init__)
        r.at = r.done = Progress(algo.prepare(engine, algo.init(r.params, data.num_clients), ctx))
    first = min(r.at.round for r in runs)
    report = RoundReporter(clock or RoundClock(sched.rounds, sched.eval_every), data.train.x.device.type,
                           algo.name if len(runs) == 1 else f"{algo.name} x{len(runs)} seeds", first, progress)
    for rnd in range(first + 1, sched.rounds + 1):
        active = [r for r in runs if r.error is None and r.at.round < rnd]
        if not active:
            break
        t0, eval_s = time.perf_counter(), 0.0
        draws = [round_draws(algo, data, sched, r.seed, rnd) for r in active]
        locals_ = [algo.start_local(r.at.state, trained, rnd)  # (with the local optimizer's state)
                   for r, (_, trained, _, _) in zip(active, draws)]
        local, idx, aug = (cat_clients(parts) for parts in (locals_, [d[2] for d in draws], [d[3] for d in draws]))
        local = train(algo, engine, local, data, idx, rnd, aug)
        bad_all = _nonfinite_clients(local)  # one check for all replicas' clients
        offset = 0
        with _signals_held(len(active) > 1):  # every replica finishes the round, or none (an interrupt waits)
            for r, (clients, trained, _, _) in zip(active, draws):
                n = len(trained)
                mine = local if len(active) == 1 else tree_map(lambda v: v[offset : offset + n], local)
                bad = [i - offset for i in bad_all if offset <= i < offset + n]
                offset += n
                try:
                    eval_s += _finish_round(algo, engine, data, sched, r, rnd, clients, trained, mine, bad)
                except Diverged as e:
                    r.error = e
            finished = [r for r in active if r.error is None]
            # the group checkpoints together: at the same rounds for all its replicas (one's time-based
            # checkpoint is every one's), so a group's checkpoints always name one common round
            if ((checkpoint_every and rnd % checkpoint_every == 0) or rnd == sched.rounds
                    or any(r.checkpoint_due is not None and r.checkpoint_due() for r in finished)):
                for r in finished:
                    if r.on_checkpoint:
                        r.on_checkpoint(r.at)
            for r in finished:
                r.done = r.at
        last = active[0].last  # (the bar shows the first replica's accuracies)
        report.on_round(rnd, time.perf_counter() - t0, eval_s, None if last is None else last.row)
    report.close()


@contextlib.contextmanager
def _signals_held(hold: bool):
    """With `hold` (in the main thread): SIGINT and SIGTERM that arrive inside wait until its end,
    then reach their handlers (Ctrl-C's KeyboardInterrupt, fedrun's SIGTERM one) as if they had just
    come. A group's replicas thus finish a round together or not at all: an interrupt during one
    replica's evaluation would leave the others a round behind, checkpointed at another round."""
    if not hold or threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    held = {s: signal.signal(s, lambda signum, frame: came.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in held.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(came):
            signal.raise_signal(s)


def _finish_round(algo: Algorithm, engine: Engine, data: FederatedData, sched: Schedule, r: Replica, rnd: int,
                  clients: torch.Tensor, trained: torch.Tensor, local: Local, bad: list[int]) -> float:
    """One replica's part of round `rnd` after local training: the divergence guard (`bad`: its
    clients with non-finite parameters), the server step, evaluation and its report (the caller
    checkpoints the group's replicas and marks the round done). Returns the seconds its evaluation
    took (0.0: none this round)."""
    if bad:
        raise Diverged(
            f"round {rnd}: {algo.name} produced NaN/inf parameters on clients "
            f"{trained[bad].tolist()[:20]}{' ...' if len(bad) > 20 else ''}"
        )
    selected = torch.searchsorted(trained, clients)  # positions of the sampled clients (both sorted)
    weights = data.train.sizes[clients].to(torch.float64) if sched.aggregate == "samples" else None
    state = algo.end_round(r.at.state, local, trained, selected, weights, data.num_clients)
    r.at = Progress(state, rnd, r.at.transmitted + len(clients) * algo.models_per_round)
    eval_s = 0.0
    if rnd % sched.eval_every == 0 or rnd == sched.rounds:
        t0 = time.perf_counter()
        r.last = _evaluate_fitted(algo, engine, r.at.state, data, sched, r.seed, rnd)
        eval_s = time.perf_counter() - t0  # the row's floats are on the host: evaluation has finished
        if not math.isfinite(r.last.row["train_loss"]):
            raise Diverged(f"round {rnd}: {algo.name} global model has a non-finite training loss")
        if r.on_eval:
            r.on_eval(rnd, r.at.transmitted, r.last)
    return eval_s


def _evaluate_fitted(algo: Algorithm, engine: Engine, state: ServerState, data: FederatedData, sched: Schedule,
                     seed: int, rnd: int) -> Evaluation:
    """`evaluate`, with the engine's full passes halved (`max_chunks`, row chunks per call) and the
    evaluation repeated from its pure inputs while it runs out of device memory; the chunks that
    fit are kept for later rounds (the same sums split differently: fedrun.run.memory)."""
    while True:
        try:
            return evaluate(algo, engine, state, data, eval_context(data, sched, seed, rnd))
        except RuntimeError as e:  # torch.OutOfMemoryError is a RuntimeError
            if not is_oom(e) or engine.max_chunks == 1:
                raise
        most = max(len(data.train.chunk_idx), len(data.test.chunk_idx))  # (a larger max_chunks is all of them)
        engine.max_chunks = (min(engine.max_chunks, most) + 1) // 2
        _free_cached()


def _nonfinite_clients(local: Local) -> list[int]:
    ok = None
    for v in tree_leaves(local):
        f = torch.isfinite(v.reshape(len(v), -1)).all(1)  # (1-D: a per-client counter)
        ok = f if ok is None else ok & f
    return torch.nonzero(~ok).flatten().tolist() if not bool(ok.all()) else []

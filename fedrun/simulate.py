"""THE round loop: sample clients, local steps for all of them at once, server step, evaluate, log."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .algorithms.base import Algorithm, ServerState
from .data.federated import FederatedData
from .evaluate import Evaluation, evaluate
from .functional import Engine, Params, stack


class Diverged(RuntimeError):
    """A loss or parameter became NaN or inf."""


def round_generator(seed: int, rnd: int, stream: int = 0) -> torch.Generator:
    """CPU generator for (seed, round, stream): the same on every device and engine.
    Stream 0 draws the round's clients and minibatches, stream 1 the test-time adaptation batches."""
    state = np.random.SeedSequence([seed, rnd, stream]).generate_state(2, dtype=np.uint64)
    return torch.Generator().manual_seed(int(state[0] >> np.uint64(1)))


@dataclass
class Schedule:
    rounds: int
    tau: int
    clients_per_round: int
    batch_size: int
    eval_every: int = 1
    personalize_batch: int | None = None  # None: personalize on all training rows


def personalization_batch(data: FederatedData, size: int, seed: int, rnd: int):
    """A minibatch of `size` training rows of EVERY client for the test-time adaptation of round
    `rnd`, drawn from its own random stream (so it does not shift the training draws)."""
    g = round_generator(seed, rnd, stream=1)
    clients = torch.arange(data.num_clients, device=data.train.x.device)
    u = torch.rand(data.num_clients, size, generator=g).to(data.train.x.device)
    idx = data.train.sample_indices(clients, u)
    return data.train.x[idx], data.train.y[idx]


def sample_round(data: FederatedData, sched: Schedule, k: int, seed: int, rnd: int):
    """Sampled clients [m] and row indices [m, tau, k, B] of every minibatch of the round."""
    g = round_generator(seed, rnd)
    clients = torch.randperm(data.num_clients, generator=g)[: sched.clients_per_round].sort().values
    u = torch.rand(len(clients), sched.tau, k, sched.batch_size, generator=g)
    dev = data.train.x.device
    clients = clients.to(dev)
    return clients, data.train.sample_indices(clients, u.to(dev))


def local_training(algo: Algorithm, engine: Engine, params: Params, data: FederatedData, idx: torch.Tensor) -> Params:
    """tau local steps for all sampled clients; each step gathers every client's batches in one op."""
    x, y = data.train.x, data.train.y
    for s in range(idx.shape[1]):
        step = idx[:, s]  # [m, k, B]
        xb, yb = x[step], y[step]
        params = algo.client_step(engine, params, [(xb[:, j], yb[:, j]) for j in range(step.shape[1])])
    return params


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


class ChunkedTraining:
    """Local training of a round's clients in chunks of at most `size` clients.

    `size=None` starts with all clients at once and, when the stacked computation runs out of
    device memory, halves the chunk and retries (local training is a pure function of its inputs,
    so a retry gives the same result); the size that fit is kept for later rounds.
    """

    def __init__(self, size: int | None = None):
        self.fixed = size is not None
        self.size = size

    def __call__(self, algo: Algorithm, engine: Engine, params: Params, data: FederatedData, idx: torch.Tensor) -> Params:
        m = idx.shape[0]
        while True:
            size = min(self.size or m, m)
            try:
                parts = [
                    local_training(algo, engine, {k: v[i : i + size] for k, v in params.items()}, data, idx[i : i + size])
                    for i in range(0, m, size)
                ]
                break
            except RuntimeError as e:  # torch.OutOfMemoryError is a RuntimeError
                if self.fixed or size == 1 or not _is_oom(e):
                    raise
                self.size = (size + 1) // 2
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        if len(parts) == 1:
            return parts[0]
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


@dataclass
class Progress:
    """Where a run stands: the state after `round` rounds and the models transmitted so far."""

    state: ServerState
    round: int = 0
    transmitted: int = 0


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
) -> tuple[ServerState, Evaluation | None]:
    """Runs rounds up to `sched.rounds`, evaluating every `eval_every` rounds and after the last.

    Args:
        start: resume from this point instead of `algo.init(params)` at round 0. Every round's
            randomness derives from (seed, round) alone, so a resumed run repeats exactly.
        on_checkpoint: called every `checkpoint_every` rounds (0: never) and after the last round,
            after that round's evaluation was reported.
        client_chunk: train at most this many clients at once (None: all, split on out-of-memory).
    Returns the final server state and the last evaluation.
    """
    at = start or Progress(algo.init(params))
    train = ChunkedTraining(client_chunk)
    last = None
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=sched.rounds, initial=at.round, desc=algo.name, unit="round", dynamic_ncols=True)
    for rnd in range(at.round + 1, sched.rounds + 1):
        clients, idx = sample_round(data, sched, algo.batches_per_step, seed, rnd)
        local = train(algo, engine, stack(at.state.params, len(clients)), data, idx)
        bad = _nonfinite_clients(local)
        if bad:
            raise Diverged(
                f"round {rnd}: {algo.name} produced NaN/inf parameters on clients "
                f"{clients[bad].tolist()[:20]}{' ...' if len(bad) > 20 else ''}"
            )
        at = Progress(algo.server_update(at.state, local, None), rnd, at.transmitted + len(clients) * algo.models_per_round)
        if rnd % sched.eval_every == 0 or rnd == sched.rounds:
            batch = None
            if sched.personalize_batch:
                batch = personalization_batch(data, sched.personalize_batch, seed, rnd)
            last = evaluate(algo, engine, at.state, data, batch)
            if not math.isfinite(last.row["train_loss"]):
                raise Diverged(f"round {rnd}: {algo.name} global model has a non-finite training loss")
            if on_eval:
                on_eval(rnd, at.transmitted, last)
            if bar is not None:
                post = {"global": f"{last.row['global_acc']:.4f}"}
                if "pers_acc" in last.row:
                    post["pers"] = f"{last.row['pers_acc']:.4f}"
                bar.set_postfix(post, refresh=False)
        if on_checkpoint and ((checkpoint_every and rnd % checkpoint_every == 0) or rnd == sched.rounds):
            on_checkpoint(at)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return at.state, last


def _nonfinite_clients(params: Params) -> list[int]:
    ok = None
    for v in params.values():
        f = torch.isfinite(v.flatten(1)).all(1)
        ok = f if ok is None else ok & f
    return torch.nonzero(~ok).flatten().tolist() if not bool(ok.all()) else []

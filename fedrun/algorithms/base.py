"""What every algorithm provides to the round loop (fedrun.simulate), fedjax-style.

State is explicit. `ServerState` holds the server model, server-side extras and the persistent
state of EVERY client (`clients`: name -> tensors stacked over all C clients, e.g. control
variates), so it all lives on the device and is checkpointed with the run. A round's local state
`Local` is a NamedTuple of tensors (or dicts of tensors) stacked over the m clients that train: its
`params` is each client's model, its last field `opt` the local trainer's optimizer state (the default,
`ModelLocal`, has only these two); algorithms declare their own with what they need (pFedMe's theta,
...). `ServerState.clients` is a NamedTuple too, the type an algorithm declares as `Clients` (none
kept: the base's empty `NoClients`). `check_typed` refuses, in one line before any work, an algorithm
whose hooks return anything else.

  init(params, num_clients)                     -> ServerState
  prepare(engine, state, ctx)                   -> ServerState   (a fresh run, before round 1)
  client_init(state, clients, rnd)              -> Local     gather the round's starting point
  client_step(engine, local, batches, rnd)      -> Local     one local step for ALL clients at once
  phases()                                      -> None, or the round as Phases (see `Phase`)
  server_update(state, local, clients, selected, weights) -> ServerState
  personalize(engine, state, ctx)               -> (served or None, train loss or None)
  score(engine, served, split)                  -> (per-client summed loss, number correct)
  onboard(engine, state, ctx, new)              -> ServerState   (evaluation only: held-out clients)

where "served" is what `personalize` serves: per-client params stacked over all clients, or what
the algorithm's own `score` evaluates (Proto's prototypes, `adaptation.Prototypes`).

`clients` are the ids of the clients that trained (usually the round's sampled clients; all clients
when `train_all` is set); `selected` are the positions, within them, of the sampled clients whose
models the server aggregates, and `weights` their aggregation weights (None: uniform).

What every method's local steps share (the optimizer, BatchNorm's running statistics inside each
model's state, the local-work unit) is the local trainer's, `trainer.LocalTrainer`, a base of
`Algorithm`; `batchnorm.BatchNormState` keeps FedAvg's and FedBN's shared statistics apart.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from ..data.federated import ClientSplit, FederatedData
from ..engine import Engine
from ..engine.batchnorm import split_buffers
from ..engine.tree import Params, gather, stack, weighted_mean
from ..errors import ConfigError
from .checks import check_int, check_optional_int, check_positive
from .options import AlgorithmMeta
from .personalize import finetune, finetune_epochs, own_start
from .trainer import Local, LocalTrainer, ModelLocal, RunInfo  # noqa: F401  (Local, RunInfo: the contract's)


@dataclass(frozen=True)
class Phase:
    """One stretch of a client's local round, run for all the round's clients at once.

    Its length is `steps` (every client the same), or `epochs` passes over each client's OWN training
    rows: each pass a fresh shuffle cut into floor(n_c / batch_size) minibatches, the last partial one
    dropped (a shuffling DataLoader with drop_last, as PFLlib's clients use), so clients take
    different numbers of steps (a step of `batches` minibatches walks that many independent shuffles,
    one minibatch of each). Each step calls `step(engine, local, batches, rnd)` (the signature
    of `client_step`) with `batches` minibatches per client. The round loop runs every client for the
    most steps any training client takes and keeps a client's whole Local unchanged (torch.where,
    exact) at the steps past its own last one: still one vectorized computation.
    """

    step: Callable
    steps: int | None = None
    epochs: int | None = None
    batches: int = 1
    # an epochs phase of `batches` > 1: False, each minibatch of a step from its own shuffle (a pass is
    # floor(n_c / B) steps); True, the step's minibatches are disjoint parts of one shuffle (a pass is
    # floor(n_c / (batches B)) steps: PFLlib's clientperavg, which cuts each of its 2B-row batches in two)
    disjoint: bool = False

    def __post_init__(self):
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("a Phase has either steps or epochs")


class NoClients(NamedTuple):
    """`ServerState.clients` of a method that keeps no state per client (FedAvg, FedProx, pFedMe, ...)."""


@dataclass
class ServerState:
    params: Params
    extra: dict = field(default_factory=dict)
    # persistent per-client state, stacked over ALL clients: the algorithm's `Clients` (a NamedTuple)
    clients: tuple = field(default_factory=NoClients)
    # the local trainer's own per-client state (fedrun.algorithms.trainer): each optimizer slot's state
    # under optim.state=persist, the clients' BatchNorm statistics of the shared model under bn=local
    trainer: dict = field(default_factory=dict)


def is_trainer_entry(name: str) -> bool:
    """Whether a checkpoint's per-client entry is the local trainer's (`ServerState.trainer`: an optimizer
    slot, `trainer.slot_of`, or the clients' BatchNorm statistics of the shared model) and not the
    algorithm's own."""
    return name in ("opt", "bn_local") or name.startswith("opt.")


def client_entries(clients: tuple) -> dict:
    """A per-client state (`Algorithm.Clients`) as name -> stacked tensors: its fields."""
    return clients._asdict()


def flat_clients(state: ServerState) -> dict:
    """Every per-client entry of `state`, the algorithm's and the trainer's, by name: what a checkpoint
    holds (the names runs wrote before the state was typed)."""
    return {**client_entries(state.clients), **state.trainer}


def state_of(algo: Algorithm, params: Params, extra: dict, flat: dict) -> ServerState:
    """The ServerState of a checkpoint's parts (`flat_clients`'s form): the trainer's entries apart, the
    algorithm's in its `Clients` type."""
    own = {k: v for k, v in flat.items() if not is_trainer_entry(k)}
    return ServerState(params=params, extra=extra, clients=algo.Clients(**own),
                       trainer={k: v for k, v in flat.items() if is_trainer_entry(k)})


def _typed(value) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")  # (a NamedTuple)


def check_typed(algo: Algorithm, params: Params) -> None:
    """Raises ConfigError (one line) when `algo`'s hooks do not return the typed state the round loop, the
    local trainer and the checkpoints read: `init`'s `ServerState.clients` a NamedTuple of the class's
    `Clients` type (a checkpoint's per-client entries are read back into it), `client_init`'s Local a
    NamedTuple with the trainer's `opt` field. Tried on one client of the model state `params`, once,
    before any work (`fedrun.run.spec.RunSpec.from_config`); the random streams are left as they were."""
    who = f"algo class {type(algo).__module__}.{type(algo).__qualname__}"
    with torch.random.fork_rng(devices=[]):
        state = algo.init(params, 1)
        kind = type(state.clients)
        if not _typed(state.clients):
            raise ConfigError(f"{who}: its init returns ServerState.clients as a {kind.__name__}; declare the "
                              f"per-client state as a NamedTuple of tensors stacked over all clients and name it "
                              f"on the class (Clients = MyClients), or leave clients out when none is kept (the "
                              f"base's NoClients): see docs/extending.md")
        if kind is not algo.Clients:
            raise ConfigError(f"{who}: its init returns ServerState.clients as a {kind.__name__} but the class "
                              f"declares Clients = {algo.Clients.__name__}; set Clients = {kind.__name__} on the "
                              f"class (a checkpoint's per-client entries are read back into it): see docs/extending.md")
        one = torch.zeros(1, dtype=torch.long, device=next(iter(params.values())).device)
        local = algo.client_init(state, one, 1)
    if not _typed(local) or "opt" not in local._fields:
        got = f"a {type(local).__name__}" + (" without the field opt" if _typed(local) else "")
        raise ConfigError(f"{who}: its client_init returns the round's Local as {got}; declare a NamedTuple of "
                          f"its fields stacked over the round's clients with `opt: dict = {{}}` last (the local "
                          f"trainer's optimizer state), or return the base's ModelLocal(params=...): "
                          f"see docs/extending.md")


def all_at_once(fn: Callable, *trees):
    """`EvalContext.chunked` outside the round loop: `fn(*trees)`, every client at once."""
    return fn(*trees)


@dataclass
class EvalContext:
    """What test-time personalization may use besides the server state.

    `gen` is the round's own random stream for adaptation minibatches (it never shifts the training
    draws). `personalize_batch`: None = adapt on all of a client's training rows, N = a minibatch of N.
    `chunked(fn, *trees)`: `fn(*trees)` over trees whose leaves lead with the same clients, run as the
    round's local training is, in chunks of clients (`client_chunk`, memory='s plan, halved on out of
    memory: simulate.ChunkedTraining.map) with the chunks' results joined; `fn` must be a pure function
    of its inputs (a retry repeats it). Default: all at once.
    `passes`: the round loop's epochs machinery behind `train_passes` (simulate.context_passes, set by
    simulate.eval_context); None outside it.
    """

    data: FederatedData
    gen: torch.Generator
    batch_size: int
    tau: int
    personalize_batch: int | None = None
    chunked: Callable = all_at_once
    passes: Callable | None = None

    def train_passes(self, engine, step: Callable, start: Callable, clients: Tensor, epochs: int, out: Callable):
        """`out(local)` of the `clients`' Locals after `epochs` passes of `step` (a `client_step`'s
        signature) over each one's own TRAINING rows, from `start(clients)`, run as a round's epochs
        phase is (`Phase`: floor(n_c / batch_size) minibatches a pass, the partial last one dropped; the
        clients sorted by their steps, in the `chunked` chunks; the rows of all `clients` drawn first,
        from `gen`), the chunks' `out` joined."""
        if self.passes is None:
            raise RuntimeError("EvalContext.train_passes outside the round loop: build the context with "
                               "fedrun.simulate.eval_context")
        return self.passes(self, engine, step, start, clients, epochs, out)

    def train_batch(self, size: int | None = None, steps: tuple[int, ...] = (),
                    clients: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Minibatches of TRAINING rows of every client (or of `clients`): x [C, *steps, size, ...],
        y [C, *steps, size]."""
        return self.data.train.rows(self.train_rows(size, steps, clients))

    def train_rows(self, size: int | None = None, steps: tuple[int, ...] = (),
                   clients: Tensor | None = None) -> Tensor:
        """`train_batch`'s row indices [C, *steps, size] into the training split (the same draws)."""
        return _draw(self.data.train, size or self.personalize_batch, steps, self.gen, clients)

    def test_batch(self, size: int, steps: tuple[int, ...] = ()) -> tuple[Tensor, Tensor]:
        """Minibatches of TEST rows: only the official protocols' reproductions of code that
        personalized on test data use this (it leaks test data into personalization)."""
        return self.data.test.rows(_draw(self.data.test, size, steps, self.gen))


def _draw(split, size: int, steps: tuple[int, ...], gen: torch.Generator, clients: Tensor | None = None) -> Tensor:
    """Row indices [len(clients), *steps, size] of `split` drawn uniformly, with replacement."""
    dev = split.x.device
    clients = torch.arange(split.num_clients, device=dev) if clients is None else clients.to(dev)
    u = torch.rand(len(clients), *steps, size, generator=gen).to(dev)
    return split.sample_indices(clients, u)


class Algorithm(LocalTrainer, metaclass=AlgorithmMeta):
    """Options: the __init__ signature (names, types; no defaults), defaults: conf/algo/<name>.yaml."""

    name = "base"
    # the type of `ServerState.clients` (a NamedTuple of tensors stacked over all clients, each field a
    # tensor or a dict of them; `state_of` reads a checkpoint's per-client entries back into it)
    Clients: type = NoClients
    batches_per_step = 1  # independent minibatches each local step draws per client
    models_per_round = 1  # models a client sends the server per round (for "models transmitted")
    train_all = False  # every client trains every round (only the sampled ones are aggregated)
    # The local optimizer (`optim.*`, fedrun.algorithms.optim): `bind` accepts one other than plain SGD
    # of a constant lr only where `optim_ok` (every local update goes through `descend`)
    optim_ok = False
    # why optim.* cannot apply (one line: the mathematical reason), where the method's local update is
    # not an optimizer step on a loss (pFedMe's inner solver, Per-FedAvg's meta-step, ...)
    optim_why = "its local step is not yet written with the local trainer's descend (fedrun.algorithms.trainer)"
    # BatchNorm models (their running statistics ride in each model's state: fedrun.algorithms.trainer)
    batchnorm_ok = False
    batchnorm_why = "its local step is not yet written with the local trainer's grad (fedrun.algorithms.trainer)"

    # client_step's result depends on its `rnd` argument (e.g. a learning rate decayed over rounds):
    # compile=default then traces the round; compile=graphs gives such a rate as a tensor instead
    # (fedrun.algorithms.rates) (tests/test_acceleration.py checks this declaration for every algorithm)
    @property
    def step_uses_round(self) -> bool:
        return self.optim.schedule != "constant"

    # The official protocols' choices among this algorithm's options (fedrun.run.protocol, docs/fidelity.md):
    # option -> {protocol: value}; a protocol not named takes the value of the one it extends.
    protocol: dict[str, dict] = {}
    lr: float  # the local learning rate (`algo.lr` for every algorithm; its yaml maps it to the paper's name)
    finetune_steps: int = 0  # test-time fine-tuning of the served models (`set_finetuning`)
    finetune_epochs: int | None = None
    finetune_lr: float | None = None

    def check_params(self, params: Params) -> None:
        """Raises ConfigError (one line) when the model (its state: `engine.params_of`, with any
        BatchNorm buffers) cannot serve this algorithm; run before any file is written."""
        if split_buffers(params)[1] and not self.batchnorm_ok:
            raise ConfigError(f"algo={self.name} does not handle BatchNorm layers (their running statistics): "
                              f"{self.batchnorm_why}; use a model without BatchNorm (e.g. model.norm=group)")

    def check_tau(self, tau: int) -> None:
        """Raises ConfigError (one line) when the run's `tau` switches off part of this method's
        training (FedRep's head steps filling the whole round: its body never trains); run with the
        other option checks, before any work. Default: every tau >= 1 trains all of it."""

    def init(self, params: Params, num_clients: int) -> ServerState:
        return ServerState(params=params)

    def prepare(self, engine: Engine, state: ServerState, ctx: EvalContext) -> ServerState:
        """The state a fresh run starts round 1 from, given what this method computes from the clients'
        TRAINING rows first (FedRoD's class counts); `ctx.gen` is round 0's own stream. Called once by
        the round loop after `init` (a resumed run restores it from the checkpoint). Default: `state`."""
        return state

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> ModelLocal:
        return ModelLocal(params=stack(state.params, len(clients)))

    def client_step(self, engine: Engine, local: Local, batches: list[tuple[Tensor, Tensor]], rnd: int) -> Local:
        raise NotImplementedError

    local_epochs: int | None = None  # the local-work unit (`algo.local_epochs`): None, tau steps

    def set_local_epochs(self, epochs: int | None) -> None:
        """`algo.local_epochs` of an algorithm whose signature does not take it (options.BASE_OPTIONS):
        null, a round is `tau` steps; E, a round is E passes over each client's own training rows
        (floor(n_c / batch_size) steps each, PFLlib's unit), every step `client_step`."""
        check_optional_int("algo.local_epochs", epochs)
        self.local_epochs = epochs

    def phases(self) -> tuple[Phase, ...] | None:
        """The round's local work as a sequence of phases of their own lengths (in steps or in epochs
        of each client's rows), each with its own step function; None: `tau` calls of `client_step`,
        each with `batches_per_step` minibatches drawn as `sampling=` says. Default: None, or with
        `local_epochs` set, `client_step` for that many passes over each client's rows."""
        if self.local_epochs is None:
            return None
        return (Phase(self.client_step, epochs=self.local_epochs, batches=self.batches_per_step),)

    def server_update(self, state: ServerState, local: Local, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        new = weighted_mean(gather(local.params, selected), weights)
        return ServerState(params=new, extra=state.extra, clients=state.clients)

    def eval_params(self, state: ServerState) -> Params:
        """The shared model that evaluation scores as "global" and personalizes from."""
        return state.params

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext) -> tuple[object, Tensor | None]:
        """Per-client models served at test time (None: only the global model is served), and the
        global model's per-client training loss when computing it came for free (else None)."""
        return None, None

    def score(self, engine: Engine, served, split: ClientSplit) -> tuple[Tensor, Tensor]:
        """Per-client summed loss and number correct of what `personalize` served, over `split`."""
        return engine.evaluate({k: v.detach() for k, v in served.items()}, split, False)

    def set_finetuning(self, steps: int, epochs: int | None, lr: float | None) -> None:
        """The options algo.finetune_steps / finetune_epochs / finetune_lr, checked (one line each)."""
        check_int("algo.finetune_steps", steps, 0)
        check_optional_int("algo.finetune_epochs", epochs)
        check_positive("algo.finetune_lr", lr, allow_null=True)
        self.finetune_steps, self.finetune_epochs, self.finetune_lr = steps, epochs, lr

    def finetune_served(self, engine: Engine, state: ServerState, ctx: EvalContext, served, loss):
        """(served, loss) of `personalize` after test-time fine-tuning: `finetune_epochs` passes, or
        `finetune_steps` steps, of SGD of `finetune_lr` (null: `lr`) on each client's TRAINING rows
        (full batch, or `personalize_batch` minibatches), from its served model, or from the shared
        model when only that is served (bn=local: with each client's own statistics). Nothing when both
        are 0 / null."""
        if not (self.finetune_steps or self.finetune_epochs):
            return served, loss
        lr = self.lr if self.finetune_lr is None else self.finetune_lr
        stacked = served is not None
        # (bn=local, from the shared model: each client's own statistics; a BatchNorm model's first loss is
        # the training-mode forward's, which reads none of them)
        start, each = (served, True) if stacked else own_start(self, state, self.eval_params(state),
                                                               ctx.data.num_clients)
        if self.finetune_epochs:
            p, first = finetune_epochs(engine, start, ctx, lr, self.finetune_epochs, stacked=each)
        else:
            p, first = finetune(engine, start, ctx, lr, self.finetune_steps, stacked=each)
        return p, loss if stacked else first  # `first`: the shared model's loss, when it started there

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """The state with the held-out clients `new` (never trained, `partition.holdout`) given what
        this method's own personalization fits on their TRAINING rows before they are served
        (docs/data.md, "Unseen clients"); used by evaluation only, the training state is left as
        it was. Default: nothing to fit per client (the served models derive from the shared model
        alone, for held-out and training clients alike)."""
        return state


class LocalLR(Algorithm):
    """An algorithm whose options are its local SGD lr `lr`, the held-out clients' `new_client_steps`
    (null: tau) and the test-time fine-tuning (`set_finetuning`): Local, the body/head family
    (`bodyhead.PartSharing`), FedRoD."""

    def __init__(self, lr: float, new_client_steps: int | None,
                 finetune_steps: int, finetune_epochs: int | None, finetune_lr: float | None):
        check_positive("algo.lr", lr)
        check_optional_int("algo.new_client_steps", new_client_steps)
        self.lr, self.new_client_steps = lr, new_client_steps
        self.set_finetuning(finetune_steps, finetune_epochs, finetune_lr)

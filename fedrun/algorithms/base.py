"""What every algorithm provides to the round loop (fedrun.simulate), fedjax-style.

State is explicit. `ServerState` holds the server model, server-side extras and the persistent
state of EVERY client (`clients`: name -> tensors stacked over all C clients, e.g. control
variates), so it all lives on the device and is checkpointed with the run. A round's local state
`Local` is a dict of tensors (or dicts of tensors) stacked over the m clients that train:
`Local["params"]` is each client's model; algorithms add what they need (pFedMe's theta, ...).

  init(params, num_clients)                     -> ServerState
  client_init(state, clients, rnd)              -> Local     gather the round's starting point
  client_step(engine, local, batches, rnd)      -> Local     one local step for ALL clients at once
  phases()                                      -> None, or the round as Phases (see `Phase`)
  server_update(state, local, clients, selected, weights) -> ServerState
  personalize(engine, state, ctx)               -> (served or None, train loss or None)
  onboard(engine, state, ctx, new)              -> ServerState   (evaluation only: held-out clients)

where "served" is per-client params stacked over all clients, or `Prototypes` (a shared feature
extractor plus per-client class prototypes: Proto adaptation, paper 004).

`clients` are the ids of the clients that trained (usually the round's sampled clients; all clients
when `train_all` is set); `selected` are the positions, within them, of the sampled clients whose
models the server aggregates, and `weights` their aggregation weights (None: uniform).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from ..data.federated import FederatedData
from ..engine import Engine, Params, stack, weighted_mean
from ..engine.batchnorm import mean_buffers, split_buffers
from .options import AlgorithmMeta
from ..errors import ConfigError

Local = dict  # name -> stacked tensor or dict of stacked tensors, leading dim = clients training


def check_choice(option: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{option}={value!r} is not allowed; choose one of: {', '.join(map(str, allowed))}")


def check_positive(option: str, value, allow_zero: bool = False, allow_null: bool = False) -> None:
    if allow_null and value is None:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and (value >= 0 if allow_zero else value > 0)
    if not ok:  # inf and nan too: a run with them diverges, or trains nothing, without a word
        finite = "finite " if isinstance(value, float) and not math.isfinite(value) else ""
        words = f"a {finite}number {'>= 0' if allow_zero else '> 0'}" + (" or null" if allow_null else "")
        raise ConfigError(f"{option}={value!r} must be {words}")


def check_int(option: str, value, low: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(f"{option}={value!r} must be an integer >= {low}")


def check_optional_int(option: str, value, low: int = 1) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
        raise ConfigError(f"{option}={value!r} must be an integer >= {low} or null")


@dataclass(frozen=True)
class Phase:
    """One stretch of a client's local round, run for all the round's clients at once.

    Its length is `steps` (every client the same), or `epochs` passes over each client's OWN training
    rows: each pass a fresh shuffle cut into floor(n_c / batch_size) minibatches, the last partial one
    dropped (a shuffling DataLoader with drop_last, as PFLlib's clients use), so clients take
    different numbers of steps. Each step calls `step(engine, local, batches, rnd)` (the signature
    of `client_step`) with `batches` minibatches per client. The round loop runs every client for the
    most steps any training client takes and keeps a client's whole Local unchanged (torch.where,
    exact) at the steps past its own last one: still one vectorized computation.
    """

    step: Callable
    steps: int | None = None
    epochs: int | None = None
    batches: int = 1

    def __post_init__(self):
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("a Phase has either steps or epochs")
        if self.epochs is not None and self.batches != 1:
            raise ValueError("an epochs Phase walks one minibatch per step")


@dataclass
class ServerState:
    params: Params
    extra: dict = field(default_factory=dict)
    clients: dict = field(default_factory=dict)  # persistent per-client state, stacked over ALL clients


@dataclass
class Prototypes:
    """Proto-adapted models served at test time: every client classifies by the nearest of its own
    class prototypes in the feature space of the shared `params` (paper 004, Sec. 2)."""

    params: Params  # unstacked, shared by all clients
    centers: Tensor  # [C, K, d] class prototypes per client
    present: Tensor  # [C, K] bool: the client has training rows of the class (else masked out)


@dataclass
class EvalContext:
    """What test-time personalization may use besides the server state.

    `gen` is the round's own random stream for adaptation minibatches (it never shifts the training
    draws). `personalize_batch`: None = adapt on all of a client's training rows, N = a minibatch of N.
    """

    data: FederatedData
    gen: torch.Generator
    batch_size: int
    tau: int
    personalize_batch: int | None = None

    def train_batch(self, size: int | None = None, steps: tuple[int, ...] = (),
                    clients: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Minibatches of TRAINING rows of every client (or of `clients`): x [C, *steps, size, ...],
        y [C, *steps, size]."""
        return _draw(self.data.train, size or self.personalize_batch, steps, self.gen, clients)

    def test_batch(self, size: int, steps: tuple[int, ...] = ()) -> tuple[Tensor, Tensor]:
        """Minibatches of TEST rows: only the official protocols' reproductions of code that
        personalized on test data use this (it leaks test data into personalization)."""
        return _draw(self.data.test, size, steps, self.gen)


def _draw(split, size: int, steps: tuple[int, ...], gen: torch.Generator,
          clients: Tensor | None = None) -> tuple[Tensor, Tensor]:
    dev = split.x.device
    clients = torch.arange(split.num_clients, device=dev) if clients is None else clients.to(dev)
    u = torch.rand(len(clients), *steps, size, generator=gen).to(dev)
    return split.rows(split.sample_indices(clients, u))


class Algorithm(metaclass=AlgorithmMeta):
    """Options: the __init__ signature (names, types; no defaults), defaults: conf/algo/<name>.yaml."""

    name = "base"
    batches_per_step = 1  # independent minibatches each local step draws per client
    models_per_round = 1  # models a client sends the server per round (for "models transmitted")
    train_all = False  # every client trains every round (only the sampled ones are aggregated)
    batchnorm = False  # handles BatchNorm models' buffers (running statistics); others refuse them
    # client_step's result depends on its `rnd` argument (e.g. a learning rate decayed over rounds):
    # compile=graphs cannot replay one captured round for another then (tests/test_acceleration.py
    # checks this declaration for every algorithm)
    step_uses_round = False
    lr: float  # the local learning rate (`algo.lr` for every algorithm; its yaml maps it to the paper's name)
    finetune_steps: int = 0  # test-time fine-tuning of the served models (`set_finetuning`)
    finetune_epochs: int | None = None
    finetune_lr: float | None = None

    def check_params(self, params: Params) -> None:
        """Raises ConfigError (one line) when the model (its state: `engine.params_of`, with any
        BatchNorm buffers) cannot serve this algorithm; run before any file is written. Any model
        without BatchNorm serves by default."""
        if split_buffers(params)[1] and not self.batchnorm:
            raise ConfigError(f"algo={self.name} does not handle BatchNorm layers (their running statistics); "
                              f"with model=mlp_bn or cnn_bn use algo=fedavg or fedbn")

    def init(self, params: Params, num_clients: int) -> ServerState:
        """A BatchNorm model's buffers (params holds the model's state) go to `extra["buffers"]`."""
        params, buffers = split_buffers(params)
        return ServerState(params=params, extra={"buffers": buffers} if buffers else {})

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> Local:
        local = {"params": stack(state.params, len(clients))}
        if "buffers" in state.extra:
            local["buffers"] = stack(state.extra["buffers"], len(clients))
        return local

    def client_step(self, engine: Engine, local: Local, batches: list[tuple[Tensor, Tensor]], rnd: int) -> Local:
        raise NotImplementedError

    def phases(self) -> tuple[Phase, ...] | None:
        """The round's local work as a sequence of phases of their own lengths (in steps or in epochs
        of each client's rows), each with its own step function; None (the default): `tau` calls of
        `client_step`, each with `batches_per_step` minibatches drawn as `sampling=` says."""
        return None

    def server_update(self, state: ServerState, local: Local, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        new = weighted_mean({k: v[selected] for k, v in local["params"].items()}, weights)
        extra = state.extra
        if "buffers" in local:  # FedAvg with BatchNorm: running statistics averaged like parameters
            extra = {**extra, "buffers": mean_buffers({k: v[selected] for k, v in local["buffers"].items()}, weights)}
        return ServerState(params=new, extra=extra, clients=state.clients)

    def eval_params(self, state: ServerState) -> Params:
        """The shared model that evaluation scores as "global" and personalizes from (with a
        BatchNorm model's running statistics)."""
        return {**state.params, **state.extra.get("buffers", {})}

    def personalize(self, engine: Engine, state: ServerState,
                    ctx: EvalContext) -> tuple[Params | Prototypes | None, Tensor | None]:
        """Per-client models served at test time (None: only the global model is served), and the
        global model's per-client training loss when computing it came for free (else None)."""
        return None, None

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
        model when only that is served. Nothing when both are 0 / null."""
        if not (self.finetune_steps or self.finetune_epochs):
            return served, loss
        lr = self.lr if self.finetune_lr is None else self.finetune_lr
        stacked = served is not None
        start = served if stacked else self.eval_params(state)
        if self.finetune_epochs:
            p, first = finetune_epochs(engine, start, ctx, lr, self.finetune_epochs, stacked=stacked)
        else:
            p, first = finetune(engine, start, ctx, lr, self.finetune_steps, stacked=stacked)
        return p, loss if stacked else first  # `first`: the shared model's loss, when it started there

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """The state with the held-out clients `new` (never trained, `partition.holdout`) given what
        this method's own personalization fits on their TRAINING rows before they are served
        (docs/data.md, "Unseen clients"); used by evaluation only, the training state is left as
        it was. Default: nothing to fit per client (the served models derive from the shared model
        alone, for held-out and training clients alike)."""
        return state


def clip_per_client(g: Params, max_norm: float | None) -> Params:
    """Scales each client's gradient (leading dim = clients) to norm <= max_norm, with
    torch.nn.utils.clip_grad_norm_'s rule (scale max_norm / (norm + 1e-6) when below 1)."""
    if not max_norm:
        return g
    sq = sum(v.flatten(1).pow(2).sum(1) for v in g.values())
    scale = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)
    return {k: v * scale.view(-1, *[1] * (v.dim() - 1)) for k, v in g.items()}


def sgd(params: Params, grads: Params, lr: float) -> Params:
    """params - lr * grads for every tensor, as ONE multi-tensor op (torch._foreach_add: on CUDA a
    few fused launches for all tensors; on the CPU the same per-tensor torch.add, bit for bit).
    Gradients in another dtype (bf16 autocast) are cast to the parameters' first."""
    keys = list(params)
    g = [grads[k] if grads[k].dtype == params[k].dtype else grads[k].to(params[k].dtype) for k in keys]
    return dict(zip(keys, torch._foreach_add([params[k] for k in keys], g, alpha=-lr)))


def sgd_each(params: Params, grads: Params, lr: float) -> Params:
    """`sgd` one tensor at a time: inside torch.func transforms (vmap has no rule for foreach ops)."""
    return {k: torch.add(params[k], grads[k], alpha=-lr) for k in params}


def sgd_step(engine, local: Local, batches, lr: float) -> Local:
    """One plain SGD step of every client's `local["params"]` on its one minibatch (FedAvg's local
    step; Local's and FedPer's too)."""
    (x, y), = batches
    if "buffers" in local:  # a BatchNorm model: training-mode statistics, running ones updated
        g, _, buffers = engine.train_grad(local["params"], local["buffers"], x, y)
        return {**local, "params": sgd(local["params"], g, lr), "buffers": buffers}
    g, _ = engine.grad(local["params"], x, y)
    return {**local, "params": sgd(local["params"], g, lr)}


class OneStepPersonalization:
    """Serves each client the server model after `finetune_steps` (default one) gradient steps of lr
    `self.alpha` (or `finetune_lr`, every algorithm's name for it, when given) on the client's own
    training rows (Per-FedAvg's test-time update; "FedAvg + update" for FedAvg; FedAvg + fine-tuning
    with more steps)."""

    alpha: float
    finetune_steps: int = 1
    finetune_epochs: int | None = None
    finetune_lr: float | None = None

    @property
    def test_lr(self) -> float:
        return self.alpha if self.finetune_lr is None else self.finetune_lr

    def finetune_served(self, engine: Engine, state: ServerState, ctx: EvalContext, served, loss):
        return served, loss  # `personalize` is the fine-tuning

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext) -> tuple[Params, Tensor]:
        if self.finetune_epochs:
            return finetune_epochs(engine, self.eval_params(state), ctx, self.test_lr, self.finetune_epochs)
        return finetune(engine, self.eval_params(state), ctx, self.test_lr, self.finetune_steps)


def finetune(engine: Engine, params: Params, ctx: EvalContext, lr: float, steps: int,
             stacked: bool = False) -> tuple[Params, Tensor | None]:
    """Every client's model after `steps` SGD steps of `lr` from the shared `params` (`stacked`:
    from each client's own, stacked over all clients) on its own TRAINING rows: full-batch steps,
    or (with `personalize_batch`) one fresh minibatch per step. Also returns the starting models'
    per-client loss on the first step's rows. One step from shared params is `one_step_adapt` (the
    same draws as before this option existed)."""
    if steps == 1 and not stacked:
        batch = ctx.train_batch() if ctx.personalize_batch else None
        return one_step_adapt(engine, params, ctx.data.train, lr, batch)
    x = y = None
    if ctx.personalize_batch:
        x, y = ctx.train_batch(steps=(steps,))
    p, loss = params, None
    for s in range(steps):
        first = s == 0 and not stacked
        if x is None:
            g, l = engine.full_grad(p, ctx.data.train, shared=first)
        else:
            g, l = engine.grad(stack(p, len(x)) if first else p, x[:, s], y[:, s])
        p = sgd(p, g, lr)  # step 0 broadcasts the shared params to [C, ...]
        loss = l if loss is None else loss
    return p, loss


def finetune_epochs(engine: Engine, params: Params, ctx: EvalContext, lr: float, epochs: int,
                    stacked: bool = False) -> tuple[Params, None]:
    """Every client's model after `epochs` passes of minibatch SGD of `lr` over its own TRAINING rows,
    from the shared `params` (`stacked`: from each client's own): each pass a fresh shuffle cut into floor(n_c / B) minibatches of B rows
    (B = personalize_batch, else the run's batch_size; the last partial batch dropped, as a
    DataLoader with drop_last), so clients take different numbers of steps. All clients step
    together for the largest client's count; a client's update is multiplied by 0 after its own
    last step (exact). Clients with fewer than B rows are not fine-tuned."""
    split = ctx.data.train
    B = ctx.personalize_batch or ctx.batch_size
    steps = split.sizes.cpu() // B  # [C] steps per epoch (sizes are host-known: no device sync)
    S = max(int(steps.max()), 1)
    everyone = torch.arange(split.num_clients)
    idx = split.shuffled_indices(everyone, epochs, S * B, ctx.gen).view(split.num_clients, epochs, S, B)
    live = (torch.arange(S).view(1, -1) < steps.view(-1, 1)).to(split.x.device)  # [C, S]
    p = params if stacked else stack(params, split.num_clients)
    for e in range(epochs):
        for s in range(S):
            x, y = split.rows(idx[:, e, s])
            g, _ = engine.grad(p, x, y)
            on = live[:, s]
            p = {k: p[k] - lr * on.view(-1, *[1] * (p[k].dim() - 1)).to(p[k].dtype) * g[k] for k in p}
    return p, None


def head_names(params: Params) -> list[str]:
    """The parameters of the model's output layer (the "head" of FedPer, FedRep, LG-FedAvg, FedBABU):
    those of the module that owns the last parameter (fedrun's models: MLR `linear`, MLP the last
    `net.<i>`, CNN `head`). The rest is the "body" (the representation)."""
    last = list(params)[-1].rsplit(".", 1)[0] + "."
    return [k for k in params if k.startswith(last)]


def require_body(name: str, params: Params, what: str, also: str = "") -> None:
    """One line when the model has no body (MLR is a head alone): an algorithm that splits the model
    in two (FedPer, LG-FedAvg, FedRep, FedBABU) would train or share nothing, and Proto adaptation
    has no hidden layer to embed with."""
    head = head_names(params)
    if not head or len(head) == len(params):
        raise ConfigError(f"algo={name} {what}, but this model is one layer (a head without a body); use a model "
                          f"with a hidden layer: model=mlp, dnn or cnn{also}")


def onboarding_batches(ctx: EvalContext, new: Tensor, steps: int | None) -> list[list[tuple[Tensor, Tensor]]]:
    """The minibatches the held-out clients `new` fit on: `steps` (None: tau, one round's) draws of
    the run's batch_size TRAINING rows each, from the evaluation's random stream."""
    steps = steps or ctx.tau
    x, y = ctx.train_batch(ctx.batch_size, steps=(steps,), clients=new)
    return [[(x[:, s], y[:, s])] for s in range(steps)]


def fit_part(engine: Engine, params: Params, names: list[str], batches, lr: float) -> Params:
    """Stacked `params` after SGD steps of `lr` on the entries `names` only, the rest frozen (one
    step per entry of `batches`)."""
    for (x, y), in batches:
        g, _ = engine.grad(params, x, y)
        params = {k: torch.add(v, g[k], alpha=-lr) if k in names else v for k, v in params.items()}
    return params


def gather(full: Params, ids: Tensor) -> Params:
    """The rows `ids` of per-client state stacked over all clients."""
    return {k: v[ids] for k, v in full.items()}


def scatter(full: Params, ids: Tensor, rows: Params) -> Params:
    """Per-client state with rows `ids` replaced (a new tensor: earlier states stay as they were)."""
    return {k: v.index_copy(0, ids, rows[k].to(v.dtype)) for k, v in full.items()}


def one_step_adapt(engine: Engine, params: Params, train, lr: float, batch=None) -> tuple[Params, Tensor]:
    """Every client's model after one gradient step of `lr` from the shared `params` on its own
    TRAINING rows, all of them or the given minibatch (Per-FedAvg's one-step personalization).
    Also returns the shared model's per-client loss on those rows."""
    if batch is None:
        grads, loss = engine.full_grad(params, train, shared=True)
    else:
        grads, loss = engine.grad(stack(params, len(batch[0])), *batch)
    return sgd(params, grads, lr), loss

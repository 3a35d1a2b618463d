"""The local trainer: what every method's local training shares, owned in one place.

An algorithm says what is particular to it: which models its clients train (`optim_slots`), the
gradient of each step's objective (its loss terms, through `grad` / `value_and_grad`, and its
gradient corrections: a proximal term, SCAFFOLD's control variates) and the rate. The trainer owns
the rest:

- **the optimizer** (`optim.*`: SGD, momentum, Nesterov, weight decay, Adam, AdamW, the schedules,
  persist/restart): `descend(local, key, g, lr, rnd)` is one step of it on the model in the Local's
  field `key` (or on some of its entries: FedRep's head and body, each with its own optimizer as
  PFLlib's clients keep two), with that model's optimizer state in `local.opt[slot]`. Plain SGD of a
  constant lr (the default) is `tree.sgd`, the one op every method's step always ran, so its numbers
  stay as they were. The state of every slot starts fresh, or (optim.state=persist) from the client's
  own rows of `ServerState.trainer[slot]`, kept there after the round (checkpointed with the run).
- **BatchNorm**: a model in a Local is a model STATE, its parameters with the BatchNorm layers'
  running statistics (`engine.params_of`); `grad` and `value_and_grad` run the forward in training
  mode (each client's batch statistics) and write the updated running statistics back into that
  model's state. A model's statistics go where its parameters go: averaged with them by the
  server (`bn=averaged`, FedAvg's paper; `tree.weighted_mean`), kept per client with a personal
  model; with `bn=local` (`BN_POLICIES`) each client keeps its own statistics of the shared model
  too (PFLlib's clients, whose server moves parameters only), the server's model carrying the first
  aggregated client's.
- **the local-work unit**: `tau` steps, or `local_epochs` passes over each client's own rows
  (`base.Phase`; fedrun.simulate sorts a round's clients by their numbers of steps so that a step
  computes only the clients still training).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Callable, Collection, NamedTuple

import torch
from torch import Tensor

from ..engine import Engine
from ..engine.batchnorm import is_buffer, split_buffers
from ..engine.tree import Params, gather, scatter, sgd, stack, tree_map
from ..errors import ConfigError
from .checks import check_choice
from .optim import PLAIN, LocalOptim

# a round's Local: the method's own NamedTuple of tensors (or dicts of them) stacked over the round's clients,
# its model `params` and, last, the optimizer state `opt` (`ModelLocal`'s shape; `base.check_typed` checks it)
Local = tuple


class ModelLocal(NamedTuple):
    """The round's Local of a method whose clients train one model and keep nothing else (the base
    `Algorithm.client_init`'s: Per-FedAvg's; the held-out clients' local SGD of FedALA and FedFomo)."""

    params: Params  # the clients' models, stacked (a BatchNorm model's with its running statistics)
    opt: dict = {}  # the local trainer's optimizer state, by slot (`slot_of`)

# How a shared model's BatchNorm running statistics are kept (`bn=`, docs/baselines.md "BatchNorm").
BN_POLICIES = ("averaged", "local")


@dataclass(frozen=True)
class RunInfo:
    """What a run tells its algorithm before round 1 (`LocalTrainer.bind`): the schedule's facts some
    methods size their work or schedules by (FedALA's and FedFomo's tau steps, FedPHP's and APPLE's
    rounds), the training clients' rows (APPLE's p0) and the training recipe every local step shares
    (the local optimizer `optim.*`, the BatchNorm policy `bn=`). The default is an unbound algorithm's:
    plain SGD, bn=averaged, tau 1, no rounds (a step called outside a run, in a test)."""

    rounds: int | None = None
    tau: int = 1
    batch_size: int | None = None
    num_clients: int | None = None  # every client (training and held-out)
    train_sizes: Tensor | None = field(default=None, compare=False)  # training rows of each training client (CPU)
    optim: LocalOptim = PLAIN
    bn: str = "averaged"

    @classmethod
    def of(cls, sched, data, optim: LocalOptim = PLAIN, bn: str = "averaged") -> RunInfo:
        """The run of a `simulate.Schedule` on a `FederatedData`, with the recipe `optim`, `bn`."""
        return cls(rounds=sched.rounds, tau=sched.tau, batch_size=sched.batch_size, num_clients=data.num_clients,
                   train_sizes=data.train.sizes[: data.num_train_clients].detach().cpu(), optim=optim, bn=bn)


def slot_of(key: str) -> str:
    """The slot (its key in `local.opt`, and in `ServerState.trainer`) of the optimizer state of the model in
    the Local's field `key` ("opt" for "params", the name runs written before other models had optimizers
    used)."""
    return "opt" if key == "params" else f"opt.{key}"


def _where(live: Tensor, new, old):
    """`new` for the clients `live` ([m] bool), `old` for the others: trees of one structure (a model's
    entries, an optimizer slot's state)."""
    return tree_map(lambda n, o: torch.where(live.view(-1, *[1] * (n.dim() - 1)), n, o), new, old)


class LocalTrainer:
    """Mixin of `base.Algorithm`: the run's recipe (`bind`), the optimizer, BatchNorm and the slots of
    optimizer state."""

    # the run an algorithm is bound to (`bind`); an algorithm object is never changed after it is built:
    # `bind` returns a bound copy
    run: RunInfo = RunInfo()
    optim_ok = False
    optim_why = ""

    @property
    def optim(self) -> LocalOptim:
        """The local optimizer of the bound run (`optim.*`; unbound: plain SGD of a constant lr)."""
        return self.run.optim

    @property
    def bn(self) -> str:
        """The BatchNorm policy of the bound run (`bn=`, BN_POLICIES)."""
        return self.run.bn

    def check_run(self, run: RunInfo) -> None:
        """Raises ConfigError (one line) when this algorithm cannot train the run `run` (its optimizer,
        its `bn`); run with the other option checks, before any work. Methods with options that say
        the same thing as `optim.*` refuse the pairs here too (the debiasing methods' weight decay)."""
        check_choice("bn", run.bn, BN_POLICIES)
        if not run.optim.plain and not self.optim_ok:
            raise ConfigError(f"algo={self.name} takes only optim.* defaults (name=sgd, momentum=0, weight_decay=0, "
                              f"schedule=constant): {self.optim_why}")

    def bind(self, run: RunInfo):
        """A copy of this algorithm bound to `run` (checked: `check_run`); this one is left as it was."""
        self.check_run(run)
        out = copy.copy(self)
        out.run = run
        return out

    # -- what an algorithm declares -------------------------------------------------------------

    def optim_slots(self, local: Local) -> dict[str, tuple[str, list[str]]]:
        """slot -> (the Local entry of a model the local steps train with `descend`, the entries of it
        that optimizer updates): every model a client trains, each with its own optimizer state.
        Default: the client's model `params`, all its parameters."""
        return {"opt": ("params", [k for k in local.params if not is_buffer(k)])}

    # -- the steps --------------------------------------------------------------------------------

    def grad(self, engine: Engine, local: Local, key: str, x: Tensor, y: Tensor,
             wrt: Collection[str] | None = None) -> tuple[Params, Tensor, Local]:
        """(gradients of the parameters of the model in the field `key` of `local` on the minibatch, per-client losses,
        `local` with that model's BatchNorm statistics updated by the step's forward). `wrt`: the parameters to
        differentiate (None: all); the gradients then hold only those, and no backward runs below the lowest of them
        (the LSTM's hand-written backward excepted: it computes all, `Engine.grad`), for a step that descends a part
        and freezes the rest (FedRep's and FedPAC's head steps, `PartSharing.onboard`); the
        statistics of every BatchNorm layer still move (the frozen part's too, as a torch model's in `train()`)."""
        g, loss, buffers = engine.state_grad(getattr(local, key), x, y, wrt=wrt)
        return g, loss, (local._replace(**{key: {**getattr(local, key), **buffers}}) if buffers else local)

    def value_and_grad(self, engine: Engine, local: Local, key: str, fn: Callable[..., Tensor],
                       *args) -> tuple[Params, Tensor, Local]:
        """`grad` of an objective fn(state, *args) of the model in the field `key` of `local` (a loss with the method's
        own terms: MOON's contrastive term, FedProto's prototype distance, ...)."""
        g, value, buffers = engine.state_value_and_grad(fn, getattr(local, key), *args)
        return g, value, (local._replace(**{key: {**getattr(local, key), **buffers}}) if buffers else local)

    def sgd_step(self, engine: Engine, local: Local, batches, lr: float, rnd: int) -> Local:
        """One step of the optimizer (default: plain SGD of lr) of every client's model `local.params`
        on its one minibatch of its plain loss (FedAvg's local step; Local's and FedPer's too)."""
        (x, y), = batches
        g, _, local = self.grad(engine, local, "params", x, y)
        return self.descend(local, "params", g, lr, rnd)

    def descend(self, local: Local, key: str, g: Params, lr: float, rnd: int, names=None, slot: str | None = None,
                live: Tensor | None = None) -> Local:
        """`local` after one step of the optimizer on the model in the field `key` of `local` along `g` (the gradient of
        the step's objective, corrections included) at round `rnd`'s rate for base rate `lr`: every
        parameter of `g` (or the entries `names`), with the optimizer state of `slot` (default
        `slot_of(key)`); `live` [m] bool: the clients that step (the others keep model and state)."""
        w = getattr(local, key)
        keys = [k for k in w if k in g and not is_buffer(k)] if names is None else \
            [k for k in w if k in set(names)]
        slot = slot or slot_of(key)
        sub = {k: w[k] for k in keys}
        if self.optim.plain:
            new, state = sgd(sub, {k: g[k] for k in keys}, lr), None
        else:
            state = local.opt.get(slot)
            if state is None:  # (a Local the round loop did not start: an onboarding fit, a test)
                state = self.optim.fresh({k: v[0] for k, v in sub.items()}, len(next(iter(sub.values()))))
            new, new_state = self.optim.step(sub, {k: g[k] for k in keys}, state, self.optim.lr_at(lr, rnd))
            if live is not None and new_state:
                new_state = _where(live, new_state, state)
            state = new_state
        if live is not None:
            new = _where(live, new, sub)
        out = local._replace(**{key: {**w, **new}})
        return out._replace(opt={**out.opt, slot: state}) if state else out

    # -- where the shared model's BatchNorm statistics ride (`batchnorm.BatchNormState` keeps them apart)

    def shared_buffers(self, local: Local) -> Params:
        """The round's clients' BatchNorm statistics of the shared model ({} without BatchNorm)."""
        return split_buffers(local.params)[1] if "params" in local._fields else {}

    def with_shared_buffers(self, local: Local, buffers: Params) -> Local:
        return local._replace(params={**local.params, **buffers})

    def server_with_buffers(self, state, buffers: Params):
        return replace(state, params={**state.params, **buffers})

    # -- serving under bn=local: each client's model carries its own statistics of the shared model

    def own_statistics(self, state) -> Params | None:
        """bn=local: every client's own BatchNorm statistics of the shared model (`trainer["bn_local"]`,
        stacked over all clients: training and held-out); None under bn=averaged, without BatchNorm and
        before a round kept them (the server's are then the initial model's, every client's own)."""
        return state.trainer.get("bn_local") if self.bn == "local" else None

    def with_own_statistics(self, state, models: Params, ids: Tensor | None = None) -> Params:
        """`models`, stacked over all clients (or over the clients `ids`), with each client's own
        statistics of the shared model under bn=local (PFLlib's clients: the server moves parameters
        only, so the model a client is scored with, or fits from, carries its own; a held-out client's
        are the initial model's); `models` as they are otherwise."""
        own = self.own_statistics(state)
        if own is None:
            return models
        return {**models, **(own if ids is None else gather(own, ids))}

    def own_models(self, state, ids: Tensor) -> Params:
        """The server's model stacked for the clients `ids`, each with its own statistics under bn=local (a
        held-out client's start: the initial model's statistics, as PFLlib's new client is a copy of it)."""
        return self.with_own_statistics(state, stack(state.params, len(ids)), ids)

    def kept_own_statistics(self, state, ids: Tensor, models: Params) -> dict:
        """`state.trainer` with, under bn=local, the clients `ids`' own statistics as their `models`
        [len(ids), ...] left them (a held-out client's onboarding steps in training mode move them)."""
        own = self.own_statistics(state)
        if own is None:
            return state.trainer
        return {**state.trainer, "bn_local": scatter(own, ids, {k: models[k] for k in own})}

    # -- the slots' state between rounds ----------------------------------------------------------

    def start_local(self, state, clients: Tensor, rnd: int) -> Local:
        """The round's Local: `client_init`, with the clients' own BatchNorm statistics of the shared
        model (`bn=local`) and every slot's optimizer state (fresh, or the clients' kept rows), both
        kept in the server state's `trainer` (ServerState.trainer)."""
        local = self.client_init(state, clients, rnd)
        own = self.own_statistics(state)
        if own is not None:
            local = self.with_shared_buffers(local, gather(own, clients))
        if not self.optim.stateful:
            return local
        slots = {}
        for slot, (key, names) in self.optim_slots(local).items():
            kept = state.trainer.get(slot) if self.optim.state == "persist" else None
            if kept is None:
                slots[slot] = self.optim.fresh({k: getattr(local, key)[k][0] for k in names}, len(clients))
            else:
                slots[slot] = tree_map(lambda v: v[clients], kept)
        return local._replace(opt={**local.opt, **slots})

    def end_round(self, before, local: Local, clients: Tensor, selected: Tensor, weights: Tensor | None,
                  num_clients: int):
        """`server_update` of the round's state `before`, its `trainer` state carried on: the trained
        clients' optimizer state of every slot kept (optim.state=persist) and (`bn=local`) their
        BatchNorm statistics of the shared model, the server's model carrying the first aggregated
        client's (PFLlib's server copies its first uploaded model, then averages the parameters only)."""
        state = self.server_update(before, local, clients, selected, weights)
        kept = dict(before.trainer)
        if self.bn == "local":
            buffers = self.shared_buffers(local)
            if buffers:
                full = kept.get("bn_local")
                if full is None:  # every client starts from the initial model's statistics
                    full = stack(split_buffers(self.eval_params(before))[1], num_clients)
                first = {k: v[selected[0]] for k, v in buffers.items()}
                state = self.server_with_buffers(state, first)
                kept["bn_local"] = scatter(full, clients, buffers)
        if self.optim.stateful and self.optim.state == "persist":
            rows_of = local.opt
            for slot, (key, names) in self.optim_slots(local).items():
                if slot not in rows_of:
                    continue
                full = kept.get(slot)
                if full is None:
                    full = self.optim.fresh({k: getattr(local, key)[k][0] for k in names}, num_clients)
                kept[slot] = tree_map(lambda v, rows: v.index_copy(0, clients, rows.to(v.dtype)), full, rows_of[slot])
        return replace(state, trainer=kept)

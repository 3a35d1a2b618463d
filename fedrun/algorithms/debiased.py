"""The debiased family's base: PFL, debiased personalized federated learning (Acar et al. 2021; paper
004, Algs. 1-2), its FedAvg counterpart P-Avg / Per-FedAvg (pavg.py), PFLDyn (pfldyn.py), PFLScaf
(pflscaf.py), and the non-personalized FedDyn (feddyn.py) and SCAFFOLD (scaffold.py).

Every one of them runs the same local optimizer, `DebiasedSGD` (Alg. 2, Update): K = `tau` steps, each on a
support batch D and a query batch D' (one batch without adaptation),

    w <- w - lr_t * ( clip( grad L(w; D, D') + linear term + proximal term ) + weight_decay * w )

with L the adaptation's meta-loss (`adaptation.py`: none | maml | proto), lr_t = lr * lr_decay^(t-1)
in round t, and clip a per-client gradient-norm clip (0/None: off). Per algorithm:

  pavg     no linear or proximal term (FedAvg on the meta-loss). adaptation=proto: P-Avg (Proto);
           adaptation=maml: Per-FedAvg with k-step MAML as in paper 004's experiments.
  pfldyn   R_i(w) = -<w, g_i> + alpha/2 ||w - w^t||^2 (Alg. 2, Regularizer, eq. 3): linear term -g_i,
           proximal alpha (w - w^t). After training g_i <- g_i - alpha (w_i - w^t). Server, Update_1:
               h <- h - alpha/m sum_{i in P_t} (w_i - w^t),   w^{t+1} = mean_{i in P_t} w_i - h / alpha
           (FedDyn's server; m = all clients; h = the mean of all clients' g_i, as the authors'
           code computes it; Alg. 2 writes the sum ambiguously as "sum_i w_i - w^t").
  pflscaf  R_i(w) = <w, g - g_i> (eq. 2): linear term c - c_i. Control variates, SCAFFOLD option II
           (Alg. 2): c_i <- c_i - c + (w^t - w_i) / (K beta), beta the configured `lr` (undecayed,
           as in Alg. 2 and the authors' code, also when lr_decay shrinks the steps' lr).
           Server, Update_2: c <- c + 1/m sum_{i in P_t} (c_i^new - c_i), w^{t+1} = mean w_i.
           A client sends its model AND its control variate: models_per_round = 2.
  feddyn, scaffold   pfldyn / pflscaf without adaptation and without personalized models.

The per-client states g_i / c_i persist for EVERY client in `ServerState.clients` (a NamedTuple:
PAvgClients, PFLDynClients, PFLScafClients; stacked [C, ...] on the device, checkpointed with the
run); a round gathers the sampled clients' rows into its Local (PAvgLocal, PFLDynLocal, PFLScafLocal)
and scatters them back, so unsampled clients keep theirs unchanged ("freeze stale devices", Alg. 1).

What follows the authors' code (github.com/alpemreacar/PFL), checked number by number against
traces of it (tests/test_golden_pfl.py, scripts/golden/record_pfl.py):
  * clipping: their regularizer is part of the loss, so the meta-loss gradient, the linear AND the
    proximal term are clipped together; weight decay (their optimizer's) is added unclipped.
  * weight decay skips parameters the loss does not use (torch.optim.SGD skips parameters without
    a gradient): P-Avg (Proto)'s output layer, which no regularizer touches, is not decayed.
  * MAML: the inner steps during training include weight decay, test-time steps do not and are
    clipped (`adaptation.MAML`).
  * the server averages uniformly (the paper-004 presets set aggregate=uniform).
Two choices of that code differ from the paper and are options, on under protocol=official:
  * eval_model=clients_mean: the model scored ("global") and personalized is the mean of EVERY
    client's latest local model (clients never sampled: the initial model), which is what the
    paper's curves plot; the honest default is the server model w^t (Alg. 1's output). It keeps
    one model per client in `ServerState.clients.last` ({} under eval_model=server).
  * PAvg(proto_first_step_only=True): their P-Avg (Proto) loop switches the model's Proto mode off
    inside its step loop, so each round's steps after the first embed with the network's outputs.
"""
from __future__ import annotations

from torch import Tensor

from ..engine import Engine
from ..engine.batchnorm import split_buffers
from ..engine.tree import Params, add, axpy, clip_per_client, only, scatter, stack, weighted_mean
from ..errors import ConfigError
from .adaptation import make_adaptation
from .base import Algorithm, EvalContext, RunInfo, ServerState
from .checks import check_choice, check_positive, require_body
from .personalize import own_start
from .rates import per_round

EVAL_MODELS = ("server", "clients_mean")
# paper 004's options for the engines' agreement check (fedrun.bench.agreement): a clip that clips, a
# decaying lr, two MAML inner steps
AGREEMENT_META = dict(lr=0.1, lr_decay=0.9, weight_decay=0.01, clip=0.5, inner_lr=0.05, inner_steps=2, test_steps=3)
# FedDyn and SCAFFOLD: the debiased local training with no adaptation (the MAML options are unused).
NO_ADAPTATION = dict(adaptation="none", inner_lr=0.01, inner_steps=1, first_order=False, test_steps=None)


class DebiasedSGD(Algorithm):
    """The shared local optimizer on the adaptation's meta-loss, with the linear and proximal terms
    of a subclass's regularizer (none: P-Avg); its per-client state (a NamedTuple with the field
    `last`: `last_models`, `keep_last`), its Local (a NamedTuple with the fields `params` and `opt`),
    its round's start and its server update are the subclass's."""

    name = "pavg"
    protocol = {"eval_model": dict(honest="server", official="clients_mean")}  # what the authors' code scored
    # optim.* is the optimizer of the (outer) local step: the authors' code runs it with torch.optim.SGD
    # (lr decayed per round, weight decay) after clipping the gradient of the loss with its regularizer
    # (the linear and proximal terms, SCAFFOLD's c - c_i, are part of that gradient); MAML's inner steps
    # stay plain SGD of inner_lr (with algo.weight_decay, as their inner optimizer)
    optim_ok = True
    # running statistics in the model's state, updated by the meta-loss's forwards (adaptation none or
    # proto; maml: check_params refuses); control variates and FedDyn's state over the parameters only
    batchnorm_ok = True

    def __init__(self, lr: float, lr_decay: float, weight_decay: float, clip: float | None, adaptation: str,
                 inner_lr: float, inner_steps: int, first_order: bool, test_steps: int | None,
                 eval_model: str | None, finetune_steps: int, finetune_epochs: int | None, finetune_lr: float | None):
        check_positive("algo.lr", lr)
        check_positive("algo.lr_decay", lr_decay)
        check_positive("algo.weight_decay", weight_decay, allow_zero=True)
        check_positive("algo.clip", clip or 0, allow_zero=True)
        check_choice("algo.eval_model", eval_model or "server", EVAL_MODELS)
        self.adapt = make_adaptation(adaptation, inner_lr, inner_steps, first_order, test_steps, weight_decay, clip)
        self.adaptation = adaptation
        self.lr, self.lr_decay, self.weight_decay, self.clip = lr, lr_decay, weight_decay, clip or 0
        self.eval_model = eval_model or "server"
        self.batches_per_step = self.adapt.batches
        self.set_finetuning(finetune_steps, finetune_epochs, finetune_lr)
        if adaptation == "proto" and (finetune_steps or finetune_epochs):
            raise ConfigError("algo.adaptation=proto serves class prototypes, which SGD does not fine-tune; "
                              "set algo.finetune_steps=0 algo.finetune_epochs=null, or algo.adaptation=maml or none")

    def check_run(self, run: RunInfo) -> None:
        """`optim` on top of the method's own options, refusing (one line) the pairs that say the same
        thing twice: algo.weight_decay and optim.weight_decay (both an L2 decay added to the step's
        gradient), algo.lr_decay and optim.schedule (both the lr over rounds)."""
        optim = run.optim
        if not optim.plain and self.weight_decay and optim.weight_decay:
            raise ConfigError(f"algo.weight_decay={self.weight_decay} and optim.weight_decay={optim.weight_decay} "
                              f"are both the local step's weight decay (algo={self.name}); set one of them to 0")
        if self.lr_decay != 1 and optim.schedule != "constant":
            raise ConfigError(f"algo.lr_decay={self.lr_decay} and optim.schedule={optim.schedule} both schedule the "
                              f"local lr over rounds (algo={self.name}); set algo.lr_decay=1 or "
                              "optim.schedule=constant")
        super().check_run(run)

    def check_params(self, params: Params) -> None:
        super().check_params(params)
        if split_buffers(params)[1] and self.adaptation == "maml":
            raise ConfigError(f"algo={self.name} with algo.adaptation=maml does not handle BatchNorm layers: a "
                              "second-order meta-gradient through the inner steps' batch statistics, and the running "
                              "statistics those inner forwards update, are not implemented; use "
                              "algo.adaptation=none or proto, or model.norm=group")
        if self.adaptation == "proto":
            require_body(self.name, params, "with algo.adaptation=proto embeds with the model's last hidden layer",
                         ", or algo.adaptation=maml or none")

    def lr_at(self, rnd: int) -> float:
        """lr_t of round `rnd`; under compile=graphs (`rnd` a rates.RoundRates) a tensor holding it, where
        lr_decay changes it."""
        return self.lr if self.lr_decay == 1 else per_round(self._lr_of, rnd, ("lr_decay", id(self)))

    def _lr_of(self, rnd: int) -> float:
        return self.lr * self.lr_decay ** (rnd - 1)

    @property
    def step_uses_round(self) -> bool:
        """The local step reads the round number when the learning rate decays over rounds."""
        return self.lr_decay != 1 or super().step_uses_round

    def last_models(self, params: Params, num_clients: int) -> Params:
        """The per-client state `last` at the start: every client's model is the initial one
        (eval_model=clients_mean); {} (none kept) under eval_model=server."""
        return stack(params, num_clients) if self.eval_model == "clients_mean" else {}

    def eval_params(self, state: ServerState) -> Params:
        if self.eval_model == "clients_mean":
            return weighted_mean(state.clients.last)  # (BatchNorm's integer step counter: the largest)
        return state.params

    def keep_last(self, clients_state, ids: Tensor, w: Params):
        """`clients_state` with the sampled clients' new models as their latest (eval_model=clients_mean)."""
        if not clients_state.last:
            return clients_state
        return clients_state._replace(last=scatter(clients_state.last, ids, w))

    def linear_term(self, local) -> Params | None:
        """Gradient of the regularizer's linear part."""
        return None

    def proximal_term(self, local) -> Params | None:
        return None

    def logits_embedding(self, local) -> bool:
        """Proto: embed with the network's outputs in this step (see PAvg.proto_first_step_only)."""
        return False

    def count_step(self, local):
        """`local` after a step, its step counter advanced where its Local keeps one (`steps`: PFLScaf's
        K, P-Avg's proto_first_step_only); default: none kept."""
        return local

    def client_step(self, engine: Engine, local, batches: list[tuple[Tensor, Tensor]], rnd: int):
        logits = self.logits_embedding(local)
        meta_loss = self.adapt.meta_loss(engine, logits=True) if logits else self.adapt.meta_loss(engine)
        g, _, local = self.value_and_grad(engine, local, "params", meta_loss, *[t for b in batches for t in b])
        w = local.params
        terms = [t for t in (self.linear_term(local), self.proximal_term(local)) if t is not None]
        for term in terms:
            g = add(g, term)
        g = clip_per_client(g, self.clip)
        # as torch.optim, which skips parameters without a gradient: a layer the loss does not use
        # (Proto's output layer when no regularizer touches all parameters) is neither decayed nor stepped
        skip = frozenset()
        if not terms and (self.weight_decay or not self.optim.plain):
            skip = self.adapt.unused(engine, w, batches[0][0], logits)
        if self.weight_decay:  # g + weight_decay w
            g = {**g, **axpy(self.weight_decay, w, only(g, [k for k in g if k not in skip]))}
        lr = self.lr_at(rnd)
        if self.optim.plain:  # w - lr g (the authors' arithmetic, bit for bit: tests/test_golden_pfl.py)
            out = local._replace(params={**w, **axpy(-lr, g, only(w, g))})
        else:
            out = self.descend_used(local, g, lr, rnd, skip)
        return self.count_step(out)

    def descend_used(self, local, g: Params, lr: float, rnd: int, skip: frozenset):
        """`descend` of the model's parameters but `skip` (the optimizer's state of those kept as it was)."""
        if not skip:
            return self.descend(local, "params", g, lr, rnd)
        out = self.descend(local, "params", g, lr, rnd, names=[k for k in g if k not in skip])
        before, after = local.opt.get("opt"), out.opt.get("opt")
        if before and after:
            kept = {kind: {**before[kind], **v} if isinstance(v, dict) else v for kind, v in after.items()}
            out = out._replace(opt={**out.opt, "opt": kept})
        return out

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        batches = None
        if ctx.personalize_batch and self.adaptation == "maml":
            batches = ctx.train_batch(steps=(self.adapt.test_steps,))
        if self.adaptation == "proto":  # (bn=local: each client's prototypes and model with its own statistics)
            params, each = own_start(self, state, self.eval_params(state), ctx.data.num_clients, views=True)
            return self.adapt.personalize(engine, params, ctx.data.train, shared=not each)
        return self.adapt.personalize(engine, self.eval_params(state), ctx.data.train, batches)

    def score(self, engine: Engine, served, split) -> tuple[Tensor, Tensor]:
        return self.adapt.score(engine, served, split)  # Proto serves prototypes

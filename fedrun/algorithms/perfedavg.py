"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar 2020; paper 001).

Per-FedAvg, Algorithm 1 of paper 001, one local step with independent batches D, D', D'':
    w~    = w - alpha * grad f(w; D)
    w    <- w - beta * (I - alpha * H(w; D'')) grad f(w~; D')
Variants of the Hessian term:
    fo     drop it (first-order, eq. 23);
    hf     central differences (Appendix G, eqs. 117-121):
           H g ~ [grad f(w + delta g; D'') - grad f(w - delta g; D'')] / (2 delta), g = grad f(w~; D');
    exact  the true Hessian-vector product by forward-over-reverse autodiff.
At test time both serve each client one gradient step of lr alpha from the global model on the
client's own training data ("FedAvg + update" for FedAvg).

`test_time=test_batches` reproduces how pFedMe's official code personalized Per-FedAvg (its
userperavg.py): one step of lr alpha, then one of lr beta, on two minibatches of the client's TEST rows.
That leaks test data into personalization; only the official protocols select it (and test_then_train).

The pFedMe authors' Per-FedAvg as it was when the pFedMe paper's numbers were made (CharlieDinh/pFedMe
before Nov 2020, e.g. commit c0722e7 of June 2020) differed twice from today's, and two options
reproduce it (`protocol=official_2020` sets both):
  outer_step_from=w_tilde   the outer step of lr beta is taken from the adapted model w~ instead of
                            from w: two plain SGD steps, w <- w~ - beta grad f(w~; D') (their code
                            restores w before it since March 2021, commit 71ae947);
  test_time=test_then_train the test-time steps: lr alpha on a TEST minibatch, then lr beta on a
                            TRAINING minibatch (both on test minibatches since Nov 2020, ed8e909).

No per-client state (`NoClients`); a round's clients hold the base's `ModelLocal` (their models and
their optimizer state).

The local trainer (fedrun.algorithms.trainer):
- `optim.*` applies to the outer (meta) step: it is a gradient step of the meta-objective
  F(w) = f(w - alpha grad f(w)), whose gradient is (I - alpha H) grad f(w~) (fo drops the Hessian
  term, hf approximates it), so momentum, weight decay (at w), Adam and the schedules act on F, with
  one optimizer state per client (slot "opt"). The inner step stays plain SGD of alpha: it is part of
  F's definition (the same step the test-time update takes), not a step of training. (PFLlib's
  clientperavg runs both steps with one plain-SGD optimizer, FL-bench's its configurable optimizer
  on the inner step and plain SGD on the outer; neither has momentum on the meta-objective.)
- BatchNorm: every forward runs in training mode; the model's running statistics are moved by the
  forwards at w (D) and at w~ (D'), as PFLlib's model in train() is (its restore copies parameters
  only); hf's forwards at w +- delta g are auxiliary points of the finite difference and leave them
  unchanged. variant=exact refuses BatchNorm models (`engine.hvp` differentiates the eval-mode loss).
- `algo.local_epochs=E`: E passes over each client's rows, a meta-step's 2 (3) minibatches disjoint
  parts of one shuffle, floor(n_c / (2 batch_size)) meta-steps a pass: PFLlib's clientperavg epoch.
"""
from __future__ import annotations

from ..engine import Engine
from ..engine.tree import axpy, only, sgd, stack
from ..errors import ConfigError
from .base import Algorithm, EvalContext, ModelLocal, Phase, ServerState
from .checks import check_choice, check_int, check_positive
from .personalize import OneStepPersonalization


class PerFedAvg(OneStepPersonalization, Algorithm):
    name = "perfedavg"
    VARIANTS = ("fo", "hf", "exact")
    TEST_TIME = ("train", "test_batches", "test_then_train")
    OUTER_STEP_FROM = ("w", "w_tilde")
    protocol = {"test_time": dict(honest="train", official="test_batches", official_2020="test_then_train"),
                "outer_step_from": dict(honest="w", official="w", official_2020="w_tilde")}
    agreement_options = dict(alpha=0.05, beta=0.05)  # fedrun.bench.agreement: over the yaml's
    agreement_variants = ({"variant": "hf"}, {"variant": "exact"})  # Hessian-free's extra gradients, HVPs
    optim_ok = True  # the outer (meta) step, one optimizer per client; the inner step is plain SGD of alpha
    batchnorm_ok = True  # (variant=exact: refused, see __init__)

    def __init__(self, lr: float, alpha: float, beta: float | None, variant: str, delta: float, test_time: str | None,
                 outer_step_from: str | None, finetune_steps: int, finetune_epochs: int | None,
                 finetune_lr: float | None):
        check_positive("algo.lr", lr)
        check_positive("algo.finetune_lr", finetune_lr, allow_null=True)
        self.finetune_lr = finetune_lr
        check_positive("algo.alpha", alpha, allow_zero=True)
        check_positive("algo.beta", beta, allow_null=True)
        beta = lr if beta is None else beta  # beta: the paper's name of lr (the outer step); given, it wins
        self.lr = beta
        check_int("algo.finetune_steps", finetune_steps, 1)
        if finetune_epochs is not None:
            check_int("algo.finetune_epochs", finetune_epochs, 1)
        if (test_time or "train") != "train" and (finetune_steps != 1 or finetune_epochs is not None):
            raise ConfigError(f"algo.test_time={test_time} takes its own two test-time steps; algo.finetune_steps / "
                              f"finetune_epochs need algo.test_time=train (e.g. protocol=honest)")
        self.finetune_steps, self.finetune_epochs = finetune_steps, finetune_epochs
        check_choice("algo.variant", variant, self.VARIANTS)
        check_positive("algo.delta", delta)
        check_choice("algo.test_time", test_time or "train", self.TEST_TIME)
        outer_step_from = outer_step_from or "w"
        check_choice("algo.outer_step_from", outer_step_from, self.OUTER_STEP_FROM)
        if outer_step_from == "w_tilde" and variant != "fo":
            raise ConfigError(f"algo.outer_step_from=w_tilde (set by protocol=official_2020, or given) needs "
                              f"algo.variant=fo, got {variant!r}: the Hessian term belongs to the outer step from w; "
                              "set algo.outer_step_from=w for this variant")
        self.alpha, self.beta, self.variant, self.delta = alpha, beta, variant, delta
        self.test_time = test_time or "train"
        self.outer_step_from = outer_step_from
        self.batches_per_step = 2 if variant == "fo" else 3
        if variant == "exact":
            self.batchnorm_ok = False
            self.batchnorm_why = ("algo.variant=exact's Hessian-vector product (engine.hvp) differentiates the "
                                  "eval-mode loss, not the training-mode loss through the batch statistics; "
                                  "use algo.variant=fo or hf")

    def phases(self):
        """With `local_epochs`: E passes over each client's rows, every meta-step taking its 2 (hf,
        exact: 3) minibatches as disjoint parts of the pass, floor(n_c / (2B)) meta-steps a pass, as
        PFLlib's clientperavg cuts each 2B-row batch of its loader in two."""
        if self.local_epochs is None:
            return None
        return (Phase(self.client_step, epochs=self.local_epochs, batches=self.batches_per_step, disjoint=True),)

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        if self.test_time == "train":
            return super().personalize(engine, state, ctx)
        if self.test_time == "test_batches":
            x, y = ctx.test_batch(ctx.batch_size, steps=(2,))
            batches = [(x[:, 0], y[:, 0]), (x[:, 1], y[:, 1])]
        else:  # test_then_train: the test batch is drawn first, as the authors' code did
            batches = [ctx.test_batch(ctx.batch_size), ctx.train_batch(ctx.batch_size)]
        p = self.with_own_statistics(state, stack(state.params, ctx.data.num_clients))  # (bn=local: its own)
        for (x, y), lr in zip(batches, (self.alpha, self.beta)):
            g, _, buffers = engine.state_grad(p, x, y)  # (BatchNorm: training mode, its statistics moved)
            p = {**p, **sgd(only(p, g), g, lr), **buffers}
        return p, None

    def client_step(self, engine: Engine, local: ModelLocal, batches, rnd: int) -> ModelLocal:
        """w~ = w - alpha grad f(w; D); w <- w - beta (I - alpha H(w; D'')) grad f(w~; D') (the outer step:
        one step of the client's optimizer along that gradient, from w, or from w~ with
        outer_step_from=w_tilde)."""
        (x, y), (x2, y2) = batches[:2]
        g, _, local = self.grad(engine, local, "params", x, y)  # (the statistics: moved by D's forward)
        w = local.params
        # w~ (and the finite difference's points) as models of their own, in Locals of their own
        adapted = ModelLocal(params={**w, **sgd(only(w, g), g, self.alpha)})
        g2, _, adapted = self.grad(engine, adapted, "params", x2, y2)  # (and by D''s, at w~)
        w_tilde = adapted.params
        if self.variant == "hf":
            x3, y3 = batches[2]
            at = only(w, g2)  # the finite difference's points: their statistics are left unused
            gp, _, _ = self.grad(engine, ModelLocal(params={**w, **axpy(self.delta, g2, at)}), "params", x3, y3)
            gm, _, _ = self.grad(engine, ModelLocal(params={**w, **axpy(-self.delta, g2, at)}), "params", x3, y3)
            g2 = {k: g2[k] - self.alpha * (gp[k] - gm[k]) / (2 * self.delta) for k in g2}
        elif self.variant == "exact":  # (no BatchNorm: refused)
            x3, y3 = batches[2]
            hv = engine.hvp(w, g2, x3, y3)
            g2 = axpy(-self.alpha, hv, g2)
        start = w_tilde if self.outer_step_from == "w_tilde" else {**w, **only(w_tilde, [k for k in w if k not in g])}
        return self.descend(local._replace(params=start), "params", g2, self.beta, rnd)

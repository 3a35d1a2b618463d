"""FedAvg (McMahan et al. 2017) and Per-FedAvg (Fallah, Mokhtari, Ozdaglar 2020; papers 000/001).

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
"""
from __future__ import annotations

from ..functional import Engine, Params
from .base import Algorithm, OneStepPersonalization, check_choice, check_positive


class FedAvg(OneStepPersonalization, Algorithm):
    """`tau` local SGD steps of lr `beta`; the server averages. `alpha`: lr of the test-time update."""

    name = "fedavg"

    def __init__(self, beta: float = 0.02, alpha: float = 0.02):
        check_positive("algo.beta", beta)
        check_positive("algo.alpha", alpha, allow_zero=True)
        self.beta, self.alpha = beta, alpha

    def client_step(self, engine: Engine, params: Params, batches) -> Params:
        (x, y), = batches
        g, _ = engine.grad(params, x, y)
        return {k: params[k] - self.beta * g[k] for k in params}


class PerFedAvg(OneStepPersonalization, Algorithm):
    name = "perfedavg"
    VARIANTS = ("fo", "hf", "exact")

    def __init__(self, alpha: float = 0.02, beta: float = 0.002, variant: str = "fo", delta: float = 1e-3):
        check_positive("algo.alpha", alpha, allow_zero=True)
        check_positive("algo.beta", beta)
        check_choice("algo.variant", variant, self.VARIANTS)
        check_positive("algo.delta", delta)
        self.alpha, self.beta, self.variant, self.delta = alpha, beta, variant, delta
        self.batches_per_step = 2 if variant == "fo" else 3

    def client_step(self, engine: Engine, params: Params, batches) -> Params:
        (x, y), (x2, y2) = batches[:2]
        g, _ = engine.grad(params, x, y)
        w_tilde = {k: params[k] - self.alpha * g[k] for k in params}
        g2, _ = engine.grad(w_tilde, x2, y2)
        if self.variant == "hf":
            x3, y3 = batches[2]
            gp, _ = engine.grad({k: params[k] + self.delta * g2[k] for k in params}, x3, y3)
            gm, _ = engine.grad({k: params[k] - self.delta * g2[k] for k in params}, x3, y3)
            g2 = {k: g2[k] - self.alpha * (gp[k] - gm[k]) / (2 * self.delta) for k in params}
        elif self.variant == "exact":
            x3, y3 = batches[2]
            hv = engine.hvp(params, g2, x3, y3)
            g2 = {k: g2[k] - self.alpha * hv[k] for k in params}
        return {k: params[k] - self.beta * g2[k] for k in params}

"""The local optimizer (`optim.*`, docs/baselines.md "Local optimizer") of every model a method trains
locally: SGD with momentum, Nesterov and weight decay, Adam and AdamW, each as torch.optim defines
it, and the learning rate over rounds as torch.optim.lr_scheduler's StepLR / CosineAnnealingLR /
ExponentialLR stepped once a round.

`LocalOptim.step` updates stacked parameters (leading dim = the round's clients) with a state
(momentum buffers; Adam's moments and step counts) stacked the same way. Where that state lives is
the local trainer's (fedrun/algorithms/trainer.py): a slot of the round's Local per model, with
`state=persist` carried over to the client's next round (`ServerState.clients[slot]`, checkpointed
with the run: resume stays exact), with `state=restart` started from none every round, as a fresh
torch optimizer would.

The defaults (plain SGD, constant lr) run the one `tree.sgd` op, so every number stays as it was.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from ..engine.tree import Params, per_client, sgd, zeros_like
from ..errors import ConfigError
from .checks import check_choice, check_int, check_positive
from .rates import per_round, rate_step

NAMES = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "step", "cosine", "exponential")
STATES = ("persist", "restart")


@dataclass(frozen=True)
class LocalOptim:
    """The `optim` node of conf/config.yaml (its comments say what each option does)."""

    name: str = "sgd"
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    state: str = "persist"
    schedule: str = "constant"
    step_size: int = 1
    gamma: float = 0.1
    lr_min: float = 0.0
    t_max: int | None = None  # cosine: rounds of one half period (null: the run's `rounds`)

    def __post_init__(self):
        check_choice("optim.name", self.name, NAMES)
        check_choice("optim.schedule", self.schedule, SCHEDULES)
        check_choice("optim.state", self.state, STATES)
        check_positive("optim.momentum", self.momentum, allow_zero=True)
        if self.momentum >= 1:
            raise ConfigError(f"optim.momentum={self.momentum!r} must be a number in [0, 1)")
        check_positive("optim.weight_decay", self.weight_decay, allow_zero=True)
        if not isinstance(self.nesterov, bool):
            raise ConfigError(f"optim.nesterov={self.nesterov!r} must be true or false")
        if self.nesterov and (self.name != "sgd" or self.momentum == 0):
            raise ConfigError(f"optim.nesterov=true needs optim.name=sgd and optim.momentum > 0 "
                              f"(given name={self.name}, momentum={self.momentum})")
        b = tuple(self.betas) if hasattr(self.betas, "__iter__") and not isinstance(self.betas, str) else None
        if b is None or len(b) != 2 or not all(isinstance(v, (int, float)) and 0 <= v < 1 for v in b):
            raise ConfigError(f"optim.betas={list(self.betas) if b else self.betas!r} must be two numbers in [0, 1), "
                              "e.g. [0.9, 0.999]")
        object.__setattr__(self, "betas", (float(b[0]), float(b[1])))
        check_positive("optim.eps", self.eps)
        check_int("optim.step_size", self.step_size, 1)
        check_positive("optim.gamma", self.gamma)
        check_positive("optim.lr_min", self.lr_min, allow_zero=True)
        if self.t_max is not None:
            check_int("optim.t_max", self.t_max, 1)

    @property
    def plain(self) -> bool:
        """Plain SGD of a constant lr: what every algorithm's own step computes."""
        return self.name == "sgd" and self.momentum == 0 and self.weight_decay == 0 and self.schedule == "constant"

    @property
    def stateful(self) -> bool:
        return self.name != "sgd" or self.momentum != 0

    def lr_at(self, lr: float, rnd: int) -> float:
        """The learning rate of round `rnd` (1, 2, ...): torch's scheduler after rnd - 1 steps (closed form);
        under compile=graphs (`rnd` a rates.RoundRates) a tensor holding it, where the schedule changes it."""
        if self.schedule != "constant":
            return per_round(lambda r: self._lr_of(lr, r), rnd, ("optim.lr_at", self, lr))
        return lr

    def _lr_of(self, lr: float, rnd: int) -> float:
        e = max(rnd - 1, 0)  # (round 0: a held-out client's onboarding steps take the first round's)
        if self.schedule == "step":
            return lr * self.gamma ** (e // self.step_size)
        if self.schedule == "exponential":
            return lr * self.gamma ** e
        if self.schedule == "cosine":
            return self.lr_min + (lr - self.lr_min) * (1 + math.cos(math.pi * e / self.t_max)) / 2
        raise ValueError(f"unknown schedule {self.schedule!r}")

    # -- per-client state -------------------------------------------------------------------------

    def fresh(self, params: Params, m: int) -> dict:
        """No state yet (a new torch optimizer) for m clients shaped like unstacked `params`."""
        if self.name == "sgd":
            return {"momentum": zeros_like(params, m)} if self.momentum else {}
        dtype, device = next(iter(params.values())).dtype, next(iter(params.values())).device
        return {"exp_avg": zeros_like(params, m), "exp_avg_sq": zeros_like(params, m),
                "step": torch.zeros(m, dtype=dtype, device=device)}

    def step(self, params: Params, grads: Params, state: dict, lr: float) -> tuple[Params, dict]:
        """One step of every client (stacked params, grads and state): torch.optim's update, op for op."""
        if self.plain:
            return sgd(params, grads, lr), state
        g = {k: grads[k].to(params[k].dtype) for k in params}
        if self.name == "sgd":
            return self._sgd(params, g, state, lr)
        return self._adam(params, g, state, lr)

    def _sgd(self, p: Params, g: Params, state: dict, lr: float) -> tuple[Params, dict]:
        wd, mu = self.weight_decay, self.momentum
        if wd:
            g = {k: g[k].add(p[k], alpha=wd) for k in p}
        if mu:
            # torch's first step sets buf = grad; 0 * mu + grad is the same number (dampening 0)
            buf = {k: state["momentum"][k].mul(mu).add(g[k]) for k in p}
            state = {**state, "momentum": buf}
            g = {k: g[k].add(buf[k], alpha=mu) for k in p} if self.nesterov else buf
        return {k: rate_step(p[k], g[k], lr) for k in p}, state

    def _adam(self, p: Params, g: Params, state: dict, lr: float) -> tuple[Params, dict]:
        b1, b2, wd = *self.betas, self.weight_decay
        step = state["step"] + 1
        if wd and self.name == "adamw":  # decoupled: the parameters shrink before the update
            p = {k: p[k].mul(1 - lr * wd) for k in p}
        elif wd:
            g = {k: g[k].add(p[k], alpha=wd) for k in p}
        m = {k: state["exp_avg"][k].lerp(g[k], 1 - b1) for k in p}
        v = {k: state["exp_avg_sq"][k].mul(b2).addcmul(g[k], g[k], value=1 - b2) for k in p}
        s = step.to(torch.float64)
        step_size = lr / (1 - b1 ** s)  # per client, in float64 as torch's Python floats
        bc2_sqrt = (1 - b2 ** s).sqrt()
        new = {}
        for k in p:
            denom = (v[k].sqrt() / per_client(bc2_sqrt, v[k])).add(self.eps)
            new[k] = p[k] - per_client(step_size, p[k]) * (m[k] / denom)
        return new, {"exp_avg": m, "exp_avg_sq": v, "step": step}


PLAIN = LocalOptim()


def local_optim(node, rounds: int) -> LocalOptim:
    """The `optim` config node (a DictConfig, a dict or None: the defaults) as a checked LocalOptim;
    cosine's t_max null becomes `rounds`."""
    if node is None:
        return PLAIN
    given = dict(node.items()) if hasattr(node, "items") else dict(node)
    known = set(LocalOptim.__dataclass_fields__)
    for k in given:
        if k not in known:
            raise ConfigError(f"optim.{k} is not an option; the options: {', '.join(sorted(known))}")
    out = LocalOptim(**given)
    if out.schedule == "cosine" and out.t_max is None:
        out = LocalOptim(**{**asdict(out), "t_max": rounds})
    return out


# The options of LocalOptim that only some configurations read, with who reads them and why the others
# do not. Every other field is read by every optimizer that is not plain SGD, so `canonical` (the resume
# fingerprint's `optim`) keeps it: a field added to LocalOptim enters the fingerprint unless it is
# listed here (tests/test_fingerprint.py changes every field under every optimizer and schedule, and
# checks that a change left out of the fingerprint leaves the steps' numbers as they were).
READ_ONLY_BY: dict[str, tuple[Callable[[LocalOptim], bool], str]] = {
    "momentum": (lambda o: o.name == "sgd", "Adam's and AdamW's moments are set by betas"),
    "nesterov": (lambda o: o.name == "sgd", "Adam and AdamW have no Nesterov step"),
    "betas": (lambda o: o.name != "sgd", "SGD keeps no moment estimates"),
    "eps": (lambda o: o.name != "sgd", "SGD's step has no denominator"),
    "state": (lambda o: o.stateful, "SGD without momentum keeps no state to carry over or restart"),
    "step_size": (lambda o: o.schedule == "step", "only the step schedule decays every step_size rounds"),
    "gamma": (lambda o: o.schedule in ("step", "exponential"), "only the step and exponential schedules decay"),
    "lr_min": (lambda o: o.schedule == "cosine", "only the cosine schedule has a floor"),
    "t_max": (lambda o: o.schedule == "cosine", "only the cosine schedule has a period"),
}


def canonical(cfg: dict) -> dict:
    """A run's settings with the `optim` node reduced to what changes its numbers (resume.fingerprint):
    dropped for plain SGD (so runs from before the node existed match), else every field of
    LocalOptim but those READ_ONLY_BY says its optimizer and schedule do not read, with cosine's
    t_max null made the run's `rounds`."""
    node = cfg.get("optim")
    if not isinstance(node, dict):
        return cfg
    out = {k: v for k, v in cfg.items() if k != "optim"}
    try:
        opt = local_optim(node, cfg.get("rounds", 1))
    except ConfigError:
        return cfg
    if opt.plain:
        return out
    d = asdict(opt)
    out["optim"] = {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()
                    if k not in READ_ONLY_BY or READ_ONLY_BY[k][0](opt)}
    return out

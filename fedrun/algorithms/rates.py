"""The round's rates as tensors: how `compile=graphs` replays one captured round in every round.

A CUDA graph replays its kernels with the scalars they were captured with, so a local step that
computes `lr * g` with round 1's Python float would replay round 1's rate in every round. Under
compile=graphs (fedrun.run.acceleration) a step's `rnd` argument is therefore a `RoundRates`, not
the round number, and every rate a step derives from the round asks it for a tensor through
`per_round`: `LocalOptim.lr_at` (every `optim.schedule`), DebiasedSGD's `lr_decay` (FedDyn,
SCAFFOLD, PFLDyn, PFLScaf, PAvg). `per_round(fn, rnd, key)` is fn(rnd) for a round number (the
eager, compiled and per-client paths: their numbers are what they were), and for a RoundRates a
0-dim float64 tensor on the round's device holding fn(rnd), made the first time the step asks
(the warm-up run before the capture) and refilled in place by `RoundRates.at(rnd)`, which the
runner calls before each replay. A rate that does not change over rounds (a constant schedule,
lr_decay=1) stays a Python float, as it always was.

The tensor gives the float's numbers: `lr * g` rounds the float64 rate to g's dtype as a Python
float is (one product of the same two numbers), and Adam's `lr / (1 - beta1^t)` and AdamW's
`1 - lr * wd` are float64 operations as Python's float arithmetic is (tests/test_rates.py checks
every lr-decaying method and schedule, rate tensor against round number, bit for bit).
The schedules of FedPHP (mu_t) and APPLE (lam_t) enter through the Local that `client_init` builds
before the local steps (tensors, outside the graph), so their steps need no rate.

torch.optim's SGD update `p.add(g, alpha=-lr)` is one fused multiply-add, its rate a kernel argument:
`rate_step` gives it `addcmul(p, -rate, g)`, the same fused product, where that holds (checked once
per device and dtype, `fused_addcmul`); where not, the step runs eagerly.

Anything else a step would read from its round (arithmetic on it, a comparison, int()) raises
RoundNotCapturable, so a step that reads the round another way runs eagerly (with one line on
stderr) instead of replaying a stale round.
"""
from __future__ import annotations

from typing import Callable, Hashable

import torch
from torch import Tensor


class RoundNotCapturable(TypeError):
    """A captured local step read its round number other than through `per_round`."""


class RoundRates:
    """The rates of the round being run, as tensors a captured graph reads (module docstring)."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self._rnd: int | None = None
        self._rates: dict[Hashable, tuple[Callable[[int], float], Tensor]] = {}

    def at(self, rnd: int) -> RoundRates:
        """Round `rnd`'s values in every rate tensor (in place: a captured graph reads them)."""
        self._rnd = int(rnd)
        for fn, t in self._rates.values():
            t.fill_(float(fn(self._rnd)))
        return self

    def rate(self, key: Hashable, fn: Callable[[int], float]) -> Tensor:
        """The tensor holding fn(round) for the rate `key`, made at its first request."""
        entry = self._rates.get(key)
        if entry is None:
            if self._rnd is None:
                raise RoundNotCapturable("RoundRates.rate before RoundRates.at: no round to compute the rate of")
            if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                # (made inside the capture, its fill would be part of the graph: round 1's value forever)
                raise RoundNotCapturable(f"the rate {key!r} was first asked for inside the graph's capture")
            entry = self._rates[key] = (fn, torch.full((), float(fn(self._rnd)), dtype=torch.float64,
                                                       device=self.device))
        return entry[1]

    def __len__(self) -> int:
        return len(self._rates)

    def _refuse(self, *_):
        raise RoundNotCapturable("the local step reads its round number (compile=graphs replays one captured "
                                 "round: a rate that changes over rounds must come from per_round)")

    __int__ = __index__ = __float__ = __bool__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __floordiv__ = __mod__ = _refuse
    __pow__ = __rpow__ = __neg__ = __format__ = _refuse
    __hash__ = object.__hash__


def per_round(fn: Callable[[int], float], rnd, key: Hashable) -> float | Tensor:
    """fn(rnd) for a round number; for a RoundRates, the tensor that holds it (module docstring)."""
    if isinstance(rnd, RoundRates):
        return rnd.rate(key, fn)
    return fn(rnd)


def rate_step(p: Tensor, g: Tensor, lr: float | Tensor) -> Tensor:
    """p - lr * g as torch.optim's SGD computes it, p.add(g, alpha=-lr): one fused multiply-add
    (fma(g, -lr, p): the CPU's vector kernels, CUDA's `a + alpha * b` under nvcc's contraction). With
    a rate tensor: addcmul(p, -lr, g), value 1, which PyTorch computes as the same fused product where
    tensor1 is a 0-dim tensor of p's dtype (pytorch/pytorch#172750, CUDA float32); `fused_addcmul`
    checks that on p's device and dtype once, and a step where it does not hold raises
    RoundNotCapturable (it runs eagerly)."""
    if not isinstance(lr, Tensor):
        return p.add(g, alpha=-lr)
    if not fused_addcmul(p.device, p.dtype):
        raise RoundNotCapturable(f"optim.name=sgd's update p.add(g, alpha=-lr) is one fused multiply-add whose rate is "
                                 f"a kernel argument; addcmul with the rate as a tensor rounds otherwise on "
                                 f"{p.device.type} in {str(p.dtype).removeprefix('torch.')}")
    return torch.addcmul(p, -lr.to(p.dtype), g)


_FUSED: dict[tuple[str, torch.dtype], bool] = {}
PROBE = 65537  # elements (odd: the vector loop and its tail); two roundings differ in ~9% of them


def fused_addcmul(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether addcmul(p, -rate, g) with a 0-dim rate tensor is p.add(g, alpha=-lr) bit for bit on
    `device` in `dtype`: checked once, outside any graph capture, on PROBE random elements."""
    key = (str(device), dtype)
    if key not in _FUSED:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RoundNotCapturable("SGD's rate tensor was first used inside the graph's capture")
        gen = torch.Generator().manual_seed(0)
        p, g = (torch.randn(PROBE, generator=gen, dtype=torch.float64).to(dtype).to(device) for _ in range(2))
        lr = 0.1 * 0.997 ** 41
        rate = torch.tensor(lr, dtype=torch.float64).to(dtype).to(device)
        _FUSED[key] = bool(torch.equal(p.add(g, alpha=-lr), torch.addcmul(p, -rate, g)))
    return _FUSED[key]

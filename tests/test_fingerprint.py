"""The resume fingerprint by construction (issue 45 item 4): every option of `optim`, of every
algorithm and `precision` (and `compile`), changed one at a time, is a refused resume, or a documented
exemption whose change leaves the numbers as they were; and precision=bf16 is checked by the dtype the
local step's matrix products compute in.

The options are enumerated from the code, not listed here: LocalOptim's dataclass fields, each
algorithm's signature (fedrun.algorithms.options.signature_options, the schema its yaml fills), and
fedrun.run.acceleration's PRECISION and COMPILE. The exemptions are the code's: fedrun.algorithms.optim.
READ_ONLY_BY (an option the run's optimizer or schedule does not read); none of the others is in
fedrun.run.resume.RESUMABLE_CHANGES. A resume is judged as find_resume_point judges it: fedrun.run.resume.differences
between the fingerprint a checkpoint stores and the new run's configuration."""
from __future__ import annotations

import itertools
import os
from dataclasses import fields

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils._python_dispatch import TorchDispatchMode

from fedrun.algorithms import ServerState, algorithm_class, build, names
from fedrun.algorithms.base import RunInfo
from fedrun.algorithms.optim import READ_ONLY_BY, LocalOptim, local_optim
from fedrun.algorithms.options import signature_options
from fedrun.algorithms.trainer import LocalTrainer, ModelLocal
from fedrun.config import CONF_DIR, group_file, load_conf
from fedrun.data import synthetic
from fedrun.engine import LoopEngine, VmapEngine, params_of
from fedrun.errors import ConfigError
from fedrun.models import MLP, MLPBN
from fedrun.run.acceleration import COMPILE, PRECISION, LocalSteps
from fedrun.run.resume import differences, fingerprint
from fedrun.simulate import Schedule, simulate

ROUNDS = 3


def _stored(base: dict) -> dict:
    """The settings a checkpoint of a run of `base` stores (its fingerprint)."""
    return fingerprint(base)


def _refused(stored: dict, changed: dict) -> list[str]:
    """The lines that refuse resuming from a checkpoint that stored `stored` as a run of `changed`."""
    return differences(stored, changed)


# ---- optim ------------------------------------------------------------------------------------------

# another valid value of each field (every field of LocalOptim must have one: a new field fails here)
OTHER = {"name": {"sgd": "adam", "adam": "adamw", "adamw": "adam"}, "momentum": {0.0: 0.5, 0.9: 0.5},
         "nesterov": {False: True, True: False}, "weight_decay": {0.0: 0.01, 0.01: 0.0}, "betas": [0.8, 0.99],
         "eps": 1e-6, "state": {"persist": "restart"}, "schedule": {"constant": "step", "step": "cosine",
         "cosine": "exponential", "exponential": "constant"}, "step_size": 2, "gamma": 0.5, "lr_min": 0.01, "t_max": 5}

# the bases: every optimizer (SGD plain, with momentum, with weight decay alone; Adam; AdamW) at a
# constant lr, and each other schedule under SGD with momentum (cosine under Adam too)
OPTIMIZERS = [dict(name="sgd", momentum=0.0, weight_decay=0.0), dict(name="sgd", momentum=0.9, weight_decay=0.0),
              dict(name="sgd", momentum=0.0, weight_decay=0.01), dict(name="adam", momentum=0.0, weight_decay=0.0),
              dict(name="adamw", momentum=0.0, weight_decay=0.01)]
BASES = ([{**o, "schedule": "constant"} for o in OPTIMIZERS]
         + [{**OPTIMIZERS[1], "schedule": s} for s in ("step", "cosine", "exponential")]
         + [{**OPTIMIZERS[3], "schedule": "cosine"}])

class _OneClient(LocalTrainer):
    """The local trainer's round bookkeeping around one client's model (its state as the server keeps it)."""

    name, optim_ok = "one_client", True

    def client_init(self, state, clients, rnd):
        return ModelLocal(params={"w": state.params["w"].unsqueeze(0).clone()})

    def server_update(self, state, local, clients, selected, weights):
        return ServerState(params={"w": local.params["w"][0]}, clients=state.clients)


def _trajectory(node: dict) -> torch.Tensor:
    """One client's parameters after ROUNDS rounds of 2 steps of the optimizer on a quadratic, its
    state kept between rounds as the round loop keeps it (start_local, descend, end_round)."""
    trainer = _OneClient().bind(RunInfo(optim=local_optim(node, ROUNDS)))
    state, trained = ServerState(params={"w": torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)}), torch.tensor([0])
    curvature = torch.tensor([1.0, 3.0, 0.5], dtype=torch.float64)
    for rnd in range(1, ROUNDS + 1):
        local = trainer.start_local(state, trained, rnd)
        for _ in range(2):
            local = trainer.descend(local, "params", {"w": local.params["w"] * curvature - 0.3}, 0.1, rnd)
        state = trainer.end_round(state, local, trained, trained, None, 1)
    return state.params["w"].unsqueeze(0)


def _other(field: str, value):
    alt = OTHER[field]
    return alt[value] if isinstance(alt, dict) else alt


def test_every_field_of_local_optim_has_another_value_here():
    assert set(OTHER) == {f.name for f in fields(LocalOptim)}


@pytest.mark.parametrize("base", BASES, ids=lambda b: "-".join(str(v) for v in b.values()))
def test_every_optim_option_is_refused_or_reads_no_number(base):
    """Each field changed alone: the resume is refused, or READ_ONLY_BY says this optimizer and
    schedule do not read it, and then the steps' numbers are bit for bit the same. (A refused change
    may compute the same numbers: Adam and AdamW without weight decay; refusing it costs a restart.)"""
    opt, start, stored = local_optim(base, ROUNDS), _trajectory(base), _stored({"rounds": ROUNDS, "optim": base})
    for f in fields(LocalOptim):
        node = {**base, f.name: _other(f.name, getattr(opt, f.name) if f.name != "betas" else None)}
        try:
            local_optim(node, ROUNDS)
        except ConfigError:  # e.g. nesterov without momentum: refused before any resume
            continue
        refused = _refused(stored, {"rounds": ROUNDS, "optim": node})
        exempt = f.name in READ_ONLY_BY and not READ_ONLY_BY[f.name][0](opt)
        assert bool(refused) != exempt, (f.name, base, refused)
        if not refused:
            assert torch.equal(_trajectory(node), start), (f.name, base, node)


def test_an_old_checkpoints_optim_still_matches():
    """The fingerprint an e300027 run folder stores (its optim node reduced to what was read then:
    here Adam with a step schedule) matches the same settings today; a changed option does not."""
    stored = {"rounds": 4, "seed": 0, "optim": {"name": "adam", "weight_decay": 0.0, "schedule": "step",
                                                "betas": [0.9, 0.999], "eps": 1e-8, "state": "persist",
                                                "step_size": 2, "gamma": 0.1}}
    defaults = OmegaConf.to_container(load_conf(os.path.join(CONF_DIR, "config.yaml")).optim)
    now = {"rounds": 4, "seed": 0, "optim": {**defaults,
                                             "name": "adam", "schedule": "step", "step_size": 2}}
    assert differences(stored, OmegaConf.create(now)) == []
    assert differences(stored, OmegaConf.create({**now, "optim": {**now["optim"], "gamma": 0.5}})) == [
        "optim.gamma: 0.1 -> 0.5"]


# ---- every algorithm's options ----------------------------------------------------------------------

def _changed(value):
    if isinstance(value, bool):
        return not value
    if value is None:
        return 3
    if isinstance(value, (int, float)):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "_other"
    return [*value, 0]


@pytest.mark.parametrize("name", names())
def test_every_algorithm_option_is_refused(name):
    """Each option of the algorithm's signature changed alone refuses the resume. No algorithm option
    is exempt (none is in RESUMABLE_CHANGES): one made exempt needs a check here that its change
    leaves the numbers as they were, as the optim options have above."""
    node = OmegaConf.to_container(load_conf(group_file("algo", name)), resolve=True)
    options = signature_options(algorithm_class(name))
    assert options and set(options) <= set(node), sorted(set(options) - set(node))
    base = {"rounds": 4, "seed": 0, "algo": node}
    stored = _stored(base)
    assert _refused(stored, base) == []
    for k in options:
        assert _refused(stored, {**base, "algo": {**node, k: _changed(node[k])}}), (name, k)


# ---- precision and compile --------------------------------------------------------------------------

@pytest.mark.parametrize("option,values", [("precision", PRECISION), ("compile", COMPILE)])
def test_every_precision_and_compile_value_is_refused(option, values):
    """Neither is exempt: bf16 changes the numbers, and so may compile (Inductor's fused kernels) and
    tf32 on CUDA."""
    for a, b in itertools.permutations(values, 2):
        assert _refused(_stored({"rounds": 2, option: a}), {"rounds": 2, option: b}) == [f"{option}: {a!r} -> {b!r}"]


# ---- precision: the dtype the local step computes in ------------------------------------------------

@pytest.fixture(scope="module")
def data():
    return synthetic(num_clients=4, dim=6, num_classes=3, seed=1, cache_dir=None, chunk_len=16, size_factor=1)


class Products(TorchDispatchMode):
    """Records the dtype of every matrix product and convolution that runs (forward and backward), as
    the kernels see them: below autocast and below vmap's batching. (A forward hook on nn.Linear is no
    such witness: under vmap, torch adds the float32 bias after the bfloat16 product, so the layer's
    output is float32 whatever the product's dtype, pytorch/pytorch#192617.)"""

    def __init__(self):
        super().__init__()
        self.dtypes: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward"):
            outs = out if isinstance(out, tuple) else (out,)
            self.dtypes.update(t.dtype for t in outs if isinstance(t, torch.Tensor))
        return out


def _step_dtypes(data, precision: str, engine, model) -> set:
    """The dtypes of the products inside the local steps of one FedAvg round under `precision`
    (evaluation, outside the steps, is not recorded)."""
    steps, rec = LocalSteps("none", precision), Products()

    def local(*args, **kw):
        with rec:
            return steps(*args, **kw)

    torch.manual_seed(0)
    model = model()
    sched = Schedule(rounds=1, tau=1, clients_per_round=2, batch_size=4)
    simulate(build("fedavg", alpha=None), engine(model), data, params_of(model), sched, 0, steps=local)
    assert rec.dtypes, "no product ran inside the local steps"
    return rec.dtypes


@pytest.mark.parametrize("engine", [VmapEngine, LoopEngine], ids=["vmap", "loop"])
@pytest.mark.parametrize("model", [lambda: MLP(6, 3, hidden=[5]), lambda: MLPBN(6, 3, hidden=[5])],
                         ids=["mlp", "mlp_bn"])
def test_bf16_computes_the_steps_products_in_bfloat16(data, engine, model):
    """precision=bf16: every matrix product of the local steps (forward and backward; MLP's
    hand-written passes and MLPBN's torch.func ones) runs in bfloat16, not float16 nor float32;
    fp32 and tf32 (on the CPU) in float32."""
    assert _step_dtypes(data, "bf16", engine, model) == {torch.bfloat16}
    assert _step_dtypes(data, "fp32", engine, model) | _step_dtypes(data, "tf32", engine, model) == {torch.float32}

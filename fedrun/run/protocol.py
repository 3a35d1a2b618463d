"""Evaluation protocols (docs/fidelity.md: what each option changes and why).

`honest` (default): personalization sees only a client's training data; the numbers are those of
the algorithms as the papers describe them.
`official`: the choices the authors' public code made where the paper is silent or says otherwise
(CharlieDinh/pFedMe, alpemreacar/PFL, PFLlib), so that published numbers can be matched and the gap
to `honest` explained: aggregate=samples (the server averages weighted by clients' numbers of
training rows), and each algorithm's own choices, declared by its class beside its defaults
(`Algorithm.protocol`: option -> {protocol: value}; docs/fidelity.md lists them all). Papers report
the MAX over rounds (summary.json always has the last and the best round).
`official_2020`: `official`, but where an algorithm declares it, as the authors' code was when their
paper's numbers were made (CharlieDinh/pFedMe c0722e7, June 2020; changed in Nov 2020 and March 2021).

Every choice is its own option, left null to follow `protocol`; set one explicitly to turn it on or
off alone (e.g. `protocol=honest aggregate=samples`). An option applies only where the composed
config has it, and an algorithm's only for the algorithm that declares it (an option of the same name
in another algorithm is that algorithm's own, not a protocol choice).
"""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from ..algorithms.checks import check_choice

# protocol -> the protocol it extends (its values where it names none) and the run-level choices
EXTENDS = {"honest": None, "official": None, "official_2020": "official"}
RUN_CHOICES = {"aggregate": {"honest": "uniform", "official": "samples"}}


def _value(choices: dict, protocol: str):
    while protocol not in choices:
        protocol = EXTENDS[protocol]
    return choices[protocol]


def choices(cfg: DictConfig) -> dict:
    """{option: value} that `cfg.protocol` sets: the run-level choices, then those the chosen
    algorithm's class declares (`Algorithm.protocol`), as `algo.<option>`."""
    table = dict(RUN_CHOICES)
    table.update({f"algo.{k}": v for k, v in _declared(OmegaConf.select(cfg, "algo._target_")).items()})
    return {k: _value(v, cfg.protocol) for k, v in table.items()}


def _declared(target) -> dict:
    if target is None:
        return {}
    from hydra.utils import get_class

    try:
        return dict(getattr(get_class(str(target)), "protocol", {}))
    except Exception:  # noqa: BLE001 - a target that does not import: the run refuses it with its own line
        return {}


def apply_protocol(cfg: DictConfig) -> dict:
    """Fills, in place, every null option that `cfg.protocol` governs; returns {option: value} of
    all governed options present in `cfg` (explicit ones included), for the run's summary."""
    check_choice("protocol", cfg.protocol, sorted(EXTENDS))
    used = {}
    for key, value in choices(cfg).items():
        if OmegaConf.select(cfg, key, default="<absent>") == "<absent>":
            continue  # an option applies only where the composed config has it
        if OmegaConf.select(cfg, key) is None:
            OmegaConf.update(cfg, key, value, merge=False)
        used[key] = OmegaConf.select(cfg, key)
    return used

"""Evaluation protocols (docs/fidelity.md: what each option changes and why).

`honest` (default): personalization sees only a client's training data; the numbers are those of
the algorithms as the papers describe them.
`official`: the choices the authors' public code made where the paper is silent or says otherwise
(CharlieDinh/pFedMe, alpemreacar/PFL), so that published numbers can be matched and the gap to `honest` explained:

  aggregate=samples          server averages weighted by clients' numbers of training rows
  algo.train_all=true        (pFedMe) every client trains every round; only the sampled are aggregated
  algo.mu=0.001              (pFedMe) extra L2 term mu*theta in the inner problem
  algo.personalized=local    (pFedMe) "personalized" accuracy is that of each client's local model
  algo.test_time=test_batches  (Per-FedAvg) personalized by two SGD steps on TEST minibatches (leak)
  algo.eval_model=clients_mean (paper 004) the model scored and personalized is the mean of every
                             client's latest local model (never-sampled clients: the initial model),
                             not the server model; the curves of paper 004 plot this model
  algo.proto_first_step_only=true  (paper 004, P-Avg (Proto)) only each round's first local step
                             uses the Proto features; the authors' loop embeds with the outputs after
  algo.follow=pfllib         (APFL) PFLlib's clientAPFL update instead of the paper's (fedrun.algorithms.personal)

and papers report the MAX over rounds (summary.json always has the last and the best round).
`official_2020`: `official`, but Per-FedAvg as the pFedMe authors' code was when the pFedMe paper's
numbers were made (CharlieDinh/pFedMe c0722e7, June 2020; changed in Nov 2020 and March 2021):

  algo.outer_step_from=w_tilde   the outer step of lr beta from the adapted model (two plain SGD steps)
  algo.test_time=test_then_train personalized by a step of alpha on a TEST minibatch, then one of
                                 beta on a TRAINING minibatch

Every choice is its own option, left null to follow `protocol`; set one explicitly to turn it on or
off alone (e.g. `protocol=honest aggregate=samples`). An option applies only where the composed
config has it, and algo.mu only for pFedMe (FedProx's own algo.mu, its proximal strength, is not a
protocol choice).
"""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

CHOICES = {
    "honest": {"aggregate": "uniform", "algo.train_all": False, "algo.mu": 0.0, "algo.personalized": "theta",
               "algo.test_time": "train", "algo.outer_step_from": "w", "algo.eval_model": "server",
               "algo.proto_first_step_only": False, "algo.follow": "paper"},
    "official": {"aggregate": "samples", "algo.train_all": True, "algo.mu": 0.001, "algo.personalized": "local",
                 "algo.test_time": "test_batches", "algo.outer_step_from": "w", "algo.eval_model": "clients_mean",
                 "algo.proto_first_step_only": True, "algo.follow": "pfllib"},
}
CHOICES["official_2020"] = {**CHOICES["official"], "algo.test_time": "test_then_train", "algo.outer_step_from": "w_tilde"}
ONLY_FOR = {"algo.mu": "PFedMe"}  # option -> the algorithm class (or a subclass) whose option it is


def _governs(cfg: DictConfig, key: str) -> bool:
    """Whether `key` of `cfg` is the protocol's choice (an option of that name in another algorithm is
    its own: FedProx's algo.mu)."""
    if OmegaConf.select(cfg, key, default="<absent>") == "<absent>":
        return False
    target = OmegaConf.select(cfg, "algo._target_")
    if key not in ONLY_FOR or target is None:
        return True
    from hydra.utils import get_class

    from . import algorithms

    try:
        return issubclass(get_class(str(target)), getattr(algorithms, ONLY_FOR[key]))
    except Exception:  # noqa: BLE001 - a target that does not import: the run refuses it with its own line
        return True


def apply_protocol(cfg: DictConfig) -> dict:
    """Fills, in place, every null option that `cfg.protocol` governs; returns {option: value} of
    all governed options present in `cfg` (explicit ones included), for the run's summary."""
    from .algorithms.base import check_choice

    check_choice("protocol", cfg.protocol, sorted(CHOICES))
    used = {}
    for key, value in CHOICES[cfg.protocol].items():
        if not _governs(cfg, key):
            continue
        if OmegaConf.select(cfg, key) is None:
            OmegaConf.update(cfg, key, value, merge=False)
        used[key] = OmegaConf.select(cfg, key)
    return used

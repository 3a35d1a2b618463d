"""Algorithms. The list of algorithms is conf/algo (one yaml per algorithm, `_target_` naming its
class; a user's own folder on Hydra's search path adds more): `names()` and `build()` read it, and
nothing else in fedrun keeps a list of algorithm names. The imports below are the Python API."""
from __future__ import annotations

from .base import Algorithm, ServerState
from ..errors import ConfigError
from .debias import FedDyn, PAvg, PFLDyn, PFLScaf, Scaffold
from .perfedavg import FedAvg, PerFedAvg
from .fedbn import FedBN
from .fedprox import FedProx
from .personal import APFL, Ditto, LocalOnly
from .pfedme import PFedMe
from .split import FedBABU, FedPer, FedRep, LGFedAvg

__all__ = ["Algorithm", "ConfigError", "ServerState", "FedAvg", "PerFedAvg", "PFedMe", "PAvg", "PFLDyn", "PFLScaf",
           "FedDyn", "Scaffold", "FedProx", "LocalOnly", "Ditto", "APFL", "FedPer", "LGFedAvg", "FedRep", "FedBABU", "FedBN",
           "names", "build"]


def names(roots: list[str] | None = None) -> list[str]:
    """The algorithms `fedrun algo=...` accepts: the yamls of conf/algo (and of `roots`, if given)."""
    from ..config import group_options

    return group_options("algo", roots)


def build(name: str, roots: list[str] | None = None, **options) -> Algorithm:
    """The algorithm `fedrun algo=<name> algo.<k>=<v> ...` builds, from its yaml with `options` on top."""
    from hydra.utils import instantiate

    from ..config import group_file, load_conf

    if name not in names(roots):
        raise ConfigError(f"algo={name!r} is not a known algo; choose one of: {', '.join(names(roots))}")
    node = load_conf(group_file("algo", name, roots))
    for k, v in options.items():
        node[k] = v
    return instantiate(node)

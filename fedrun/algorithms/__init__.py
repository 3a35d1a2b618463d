"""Algorithms. The list of algorithms is conf/algo (one yaml per algorithm, `_target_` naming its
class; a user's own folder on Hydra's search path adds more): `names()` and `build()` read it, and
nothing else in fedrun keeps a list of algorithm names. The imports below are the Python API."""
from __future__ import annotations

from ..errors import ConfigError
from .apfl import APFL
from .apple import APPLE
from .base import Algorithm, ServerState
from .ditto import Ditto
from .fedala import FedALA
from .fedamp import FedAMP
from .fedavg import FedAvg
from .fedbabu import FedBABU
from .fedbn import FedBN
from .fedcp import FedCP
from .feddbe import FedDBE
from .feddyn import FedDyn
from .fedpac import FedPAC
from .fedfomo import FedFomo
from .fedper import FedPer
from .fedphp import FedPHP
from .fedproto import FedProto
from .fedprox import FedProx
from .gpfl import GPFL
from .fedrep import FedRep
from .fedrod import FedRoD
from .gpfl import GPFL
from .lgfedavg import LGFedAvg
from .local import LocalOnly
from .moon import MOON
from .pavg import PAvg
from .perfedavg import PerFedAvg
from .pfedme import PFedMe
from .pfldyn import PFLDyn
from .pflscaf import PFLScaf
from .scaffold import Scaffold

__all__ = ["Algorithm", "ConfigError", "ServerState", "FedAvg", "PerFedAvg", "PFedMe", "PAvg", "PFLDyn", "PFLScaf",
           "FedDyn", "Scaffold", "FedProx", "LocalOnly", "Ditto", "APFL", "FedPer", "LGFedAvg", "FedRep", "FedBABU", "FedBN",
           "MOON", "FedRoD", "FedProto", "FedDBE", "FedAMP", "FedPHP", "FedALA", "FedPAC", "GPFL", "APPLE", "FedFomo", "FedCP",
           "names", "build", "algorithm_class"]


def names(roots: list[str] | None = None) -> list[str]:
    """The algorithms `fedrun algo=...` accepts: the yamls of conf/algo (and of `roots`, if given)."""
    from ..config import group_options

    return group_options("algo", roots)


def algorithm_class(name: str, roots: list[str] | None = None) -> type:
    """The class `algo=<name>` builds (its yaml's `_target_`), not built."""
    from hydra.utils import get_class

    from ..config import group_file, load_conf

    if name not in names(roots):
        raise ConfigError(f"algo={name!r} is not a known algo; choose one of: {', '.join(names(roots))}")
    return get_class(str(load_conf(group_file("algo", name, roots))["_target_"]))


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

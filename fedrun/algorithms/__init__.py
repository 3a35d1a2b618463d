from .base import Algorithm, ConfigError, ServerState
from .debias import FedDyn, PAvg, PFLDyn, PFLScaf, Scaffold
from .perfedavg import FedAvg, PerFedAvg
from .pfedme import PFedMe

__all__ = ["Algorithm", "ConfigError", "ServerState", "FedAvg", "PerFedAvg", "PFedMe", "PAvg", "PFLDyn", "PFLScaf",
           "FedDyn", "Scaffold"]

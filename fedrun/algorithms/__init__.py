from .base import Algorithm, ConfigError, ServerState
from .perfedavg import FedAvg, PerFedAvg
from .pfedme import PFedMe

__all__ = ["Algorithm", "ConfigError", "ServerState", "FedAvg", "PerFedAvg", "PFedMe"]

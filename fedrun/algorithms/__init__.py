from .base import Algorithm, ConfigError, ServerState
from .perfedavg import FedAvg, PerFedAvg

__all__ = ["Algorithm", "ConfigError", "ServerState", "FedAvg", "PerFedAvg"]

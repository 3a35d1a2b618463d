"""LG-FedAvg (Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov, Morency 2020): FedPer's mirror
image: the server averages the HEAD only; each client keeps its BODY, its local representation
(`bodyhead.PartSharing`)."""
from __future__ import annotations

from .bodyhead import PartClients, PartSharing


class LGFedAvg(PartSharing):
    name = "lgfedavg"
    Clients = PartClients  # (a round's clients hold a `bodyhead.PartLocal`)
    personal_part = "body"

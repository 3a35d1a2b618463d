"""LG-FedAvg (Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov, Morency 2020): FedPer's mirror
image: the server averages the HEAD only; each client keeps its BODY, its local representation
(`bodyhead.PartSharing`: its `PartClients`; a round's clients hold a `PartLocal`)."""
from __future__ import annotations

from .bodyhead import PartSharing


class LGFedAvg(PartSharing):
    name = "lgfedavg"
    personal_part = "body"

"""FedPer (Arivazhagan, Aggarwal, Singh, Choudhary 2019): all parameters trained jointly for `tau`
SGD steps of lr `lr`; the server averages the BODY only; each client keeps its HEAD
(`bodyhead.PartSharing`)."""
from __future__ import annotations

from .bodyhead import PartClients, PartSharing


class FedPer(PartSharing):
    name = "fedper"
    Clients = PartClients  # (a round's clients hold a `bodyhead.PartLocal`)
    personal_part = "head"

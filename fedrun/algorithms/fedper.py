"""FedPer (Arivazhagan, Aggarwal, Singh, Choudhary 2019): all parameters trained jointly for `tau`
SGD steps of lr `lr`; the server averages the BODY only; each client keeps its HEAD
(`bodyhead.PartSharing`: its `PartClients`; a round's clients hold a `PartLocal`)."""
from __future__ import annotations

from .bodyhead import PartSharing


class FedPer(PartSharing):
    name = "fedper"
    personal_part = "head"

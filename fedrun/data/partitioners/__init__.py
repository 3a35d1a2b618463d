"""Partitioners: a class per rule, `conf/partition/<name>.yaml` instantiates it by `_target_` (see
`base` for the contract and the options every partition shares; `generic` for the general rules;
`paper` for the papers' splits)."""
from .base import Dealt, Partitioner, PartitionError, holdout_clients, proportional_test, stratified_split
from .generic import (
                      QUANTITY_SIZES,
                      Classes,
                      Dirichlet,
                      Iid,
                      Mixture,
                      Natural,
                      Quantity,
                      Shards,
                      classes,
                      dirichlet,
                      iid,
                      mixture,
                      natural,
                      quantity,
                      shards,
)
from .paper import Acid, Paper004, PerFedAvgPaper, PerFedAvgSplit, PfedmeAuthors, PfedmeLabels, PfedmePaper

__all__ = ["Dealt", "Partitioner", "PartitionError", "holdout_clients", "proportional_test", "stratified_split",
           "Classes", "Dirichlet", "Iid", "Mixture", "Natural", "Quantity", "Shards", "QUANTITY_SIZES", "classes",
           "dirichlet", "iid", "mixture", "natural", "quantity", "shards", "Acid", "Paper004", "PerFedAvgPaper",
           "PerFedAvgSplit", "PfedmeAuthors", "PfedmeLabels", "PfedmePaper"]

"""A dataset times a partition: the one way fedrun's data is made.

`composed(dataset, partition)` takes a data source (`fedrun.data.datasets`: rows, labels, natural
groups, the files that key the cache, normalization and augmentation) and a partitioner
(`fedrun.data.partitioners`: the clients' index lists, their test rows, the held-out clients), both
already built and so already checked, and returns the FederatedData. `conf/data/composed.yaml` passes
the `dataset=` and `partition=` choices; the papers' `data=` presets (`fedrun.data.presets`) pass
their own pair.
"""
from __future__ import annotations

import os
from dataclasses import replace

import numpy as np

from .cache import _cached, file_digests
from .datasets.base import Dataset
from .federated import FederatedData
from .partitioners.base import Partitioner


def composed(dataset: Dataset | None, partition: Partitioner | None, cache_dir: str | None = None,
             chunk_len: int = 256) -> FederatedData:
    """The FederatedData of `dataset` partitioned by `partition` (see the module docstring)."""
    for group, value in (("dataset", dataset), ("partition", partition)):
        if value is None:
            raise ValueError(f"data=composed needs {group}=<option> (conf/{group})")
    if isinstance(chunk_len, bool) or not isinstance(chunk_len, int) or chunk_len < 1:
        raise ValueError(f"data.chunk_len={chunk_len!r}: allowed an integer >= 1")
    partition.check_dataset(dataset)

    def build():
        rows = dataset.load()
        dealt = partition.deal(rows.train_y, rows.test_y, rows.groups)
        trx, try_, tex, tey = rows.train_x, rows.train_y, rows.test_x, rows.test_y
        if dealt.pooled:
            trx = tex = np.concatenate([trx, tex])
            try_ = tey = np.concatenate([try_, tey])

        def rows_of(x, y, parts, labels):
            return [(x[i], y[i] if labels is None else labels[c]) for c, i in enumerate(parts)]

        meta = {"num_holdout": np.array(dealt.num_holdout), **dealt.meta}
        if rows.augment_fill is not None:
            meta["augment_fill"] = rows.augment_fill
        if rows.vocab_size is not None:
            meta["vocab_size"] = np.array(rows.vocab_size)
        return (rows_of(trx, try_, dealt.train, dealt.train_labels), rows_of(tex, tey, dealt.test, dealt.test_labels),
                dealt.num_classes or rows.num_classes, meta)

    settings = {"dataset": dataset.settings(), "partition": partition.settings(), "root": os.path.abspath(dataset.root)
                if getattr(dataset, "root", None) else None}
    if cache_dir:  # the files' content hashes: a different or repaired copy is new data
        settings["files"] = file_digests(dataset.files(), cache_dir)
    data = _cached(f"{dataset.name}_{partition.name}", settings, cache_dir, build, chunk_len, augment=dataset.augment)
    return replace(data, num_holdout=int(data.num_holdout),
                   vocab_size=None if data.vocab_size is None else int(data.vocab_size))

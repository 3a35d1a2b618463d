"""fedrun's own random draws, pinned (tests/fixtures/draws.json, scripts/golden/record_draws.py):
the clients and every minibatch row `sample_round` draws for a few (seed, round) pairs under each
`sampling` (with one and two batches per step, sampled clients alone and train_all), and which of
each synthetic client's rows are its test rows. The golden traces replace `sample_round` and the
facts test's digest is order-free over train+test, so without this a change of stream or seed in
either would pass every other test."""
from __future__ import annotations

import importlib.util
import json
import os

import pytest
from helpers import FIXTURES, REPO

_spec = importlib.util.spec_from_file_location("record_draws",
                                               os.path.join(REPO, "scripts", "golden", "record_draws.py"))
record = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record)

with open(os.path.join(FIXTURES, "draws.json")) as f:
    FIXTURE = json.load(f)


def test_the_fixture_covers_every_sampling():
    from fedrun.simulate import SAMPLING

    assert {k.split("/")[0] for k in FIXTURE["draws"]} == set(SAMPLING)


def test_sample_round_draws_the_pinned_clients_and_rows():
    now = record.draws()
    assert now.keys() == FIXTURE["draws"].keys()
    for key, pinned in FIXTURE["draws"].items():
        assert now[key] == pinned, key


@pytest.mark.parametrize("key", sorted(FIXTURE["synthetic_test_rows_sha256"]))
def test_synthetic_test_rows_are_pinned_per_client(key):
    assert record.cuts()[key] == FIXTURE["synthetic_test_rows_sha256"][key]

"""Every algorithm's per-client state is of the type it declares (`Algorithm.Clients`: a NamedTuple, or
None for a dict), and a checkpoint's flat form of it (`base.flat_clients`, the names runs have always
written) is read back by `base.state_of` into that type with the same tensors: a type whose class
attribute was forgotten would resume as a dict, which its own code then cannot read."""
import pytest
import torch

from fedrun.algorithms import build, names
from fedrun.algorithms.base import client_entries, flat_clients, state_of
from fedrun.engine import params_of
from fedrun.errors import ConfigError
from fedrun.models import MLP


def _leaves(tree):
    return [tree] if torch.is_tensor(tree) else [t for v in tree.values() for t in _leaves(v)]


@pytest.mark.parametrize("name", names())
def test_per_client_state_is_the_declared_type_and_reads_back_from_its_flat_form(name):
    torch.manual_seed(0)
    algo = build(name)
    try:
        state = algo.init(params_of(MLP(6, 3, hidden=[5])), 4)
    except ConfigError:  # (a method that needs another model: FedBN's BatchNorm layers)
        pytest.skip(f"algo={name} refuses this model")
    kind = algo.Clients
    assert type(state.clients) is (dict if kind is None else kind), name
    back = state_of(algo, state.params, state.extra, flat_clients(state))
    assert type(back.clients) is type(state.clients)
    before, after = client_entries(state.clients), client_entries(back.clients)
    assert before.keys() == after.keys()
    for k in before:
        assert all(a is b for a, b in zip(_leaves(before[k]), _leaves(after[k]), strict=True)), (name, k)


@pytest.mark.parametrize("name, options", [("fedcp", {}), ("gpfl", {}), ("fedcp", {"follow": "pfllib"}),
                                           ("gpfl", {"follow": "pfllib"})])
def test_a_checkpoint_written_before_the_state_was_typed_reads_back(name, options):
    """Runs written before the state was typed hold no entry for a field that is empty ({}: FedCP's
    per-client head_g and cpn and GPFL's emb under follow=paper); `state_of` reads such a checkpoint into
    the declared type with those fields {} and the others the same tensors."""
    torch.manual_seed(0)
    algo = build(name, **options)
    state = algo.init(params_of(MLP(6, 3, hidden=[5])), 4)
    flat = flat_clients(state)
    old = {k: v for k, v in flat.items() if not (isinstance(v, dict) and not v)}
    if options:
        assert old.keys() == flat.keys()
    else:
        assert old.keys() < flat.keys()
    back = state_of(algo, state.params, state.extra, old)
    assert type(back.clients) is algo.Clients
    for k, v in client_entries(state.clients).items():
        got = client_entries(back.clients)[k]
        assert all(a is b for a, b in zip(_leaves(v), _leaves(got), strict=True)) and type(got) is type(v), k


@pytest.mark.parametrize("name", ["apple", "perfedavg", "fedavg", "pfedme", "fedbabu"])
def test_round_local_is_a_namedtuple_with_the_optimizer_state_last(name):
    """APPLE's AppleLocal; Per-FedAvg's the base's ModelLocal (`Algorithm.client_init`), which FedAvg,
    pFedMe and FedBABU build theirs from."""
    algo = build(name)
    state = algo.init(params_of(MLP(6, 3, hidden=[5])), 4)
    local = algo.client_init(state, torch.tensor([0, 2]), 1)
    assert isinstance(local, tuple) and local._fields[-1] == "opt" and local.opt == {}, name
    assert local.params["net.0.weight"].shape[0] == 2

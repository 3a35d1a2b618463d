"""Every algorithm's per-client state is of the type it declares (`Algorithm.Clients`: a NamedTuple, the
base's empty `NoClients` when none is kept), and a checkpoint's flat form of it (`base.flat_clients`, the
names runs have always written) is read back by `base.state_of` into that type with the same tensors: a
type whose class attribute was forgotten would resume as another, which its own code then cannot read.
A user's algorithm whose hooks return dicts (the Local, `ServerState.clients`) or an undeclared type is
refused in one line before any work (`base.check_typed`)."""
import sys
from typing import NamedTuple

import pytest
import torch
from helpers import fedrun

from fedrun.algorithms import build, names
from fedrun.algorithms.base import NoClients, ServerState, check_typed, client_entries, flat_clients, state_of
from fedrun.algorithms.fedavg import FedAvg
from fedrun.engine import params_of
from fedrun.engine.tree import Params, stack
from fedrun.errors import ConfigError
from fedrun.models import MLP
from fedrun.models.small import MLPBN


def _leaves(tree):
    return [tree] if torch.is_tensor(tree) else [t for v in tree.values() for t in _leaves(v)]


@pytest.mark.parametrize("name", names())
def test_per_client_state_is_the_declared_type_and_reads_back_from_its_flat_form(name):
    torch.manual_seed(0)
    algo = build(name)
    model = MLP(6, 3, hidden=[5])
    try:
        state = algo.init(params_of(model), 4)
    except ConfigError:  # (a method that needs another model: FedBN's BatchNorm layers)
        model = MLPBN(6, 3, hidden=[5])
        state = algo.init(params_of(model), 4)
    assert type(state.clients) is algo.Clients, name
    check_typed(algo, params_of(model))  # (its hooks' state typed: no refusal)
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


class _Point(NamedTuple):  # a user's per-client state, typed but not named on its class
    w: Params


class _NoOpt(NamedTuple):  # a round's Local without the local trainer's field
    params: Params


class _DictLocal(FedAvg):  # written before the typed contract: its Local a dict
    def client_init(self, state, clients, rnd):
        return {"params": stack(state.params, len(clients))}


class _LocalWithoutOpt(FedAvg):
    def client_init(self, state, clients, rnd):
        return _NoOpt(params=stack(state.params, len(clients)))


class _DictClients(FedAvg):  # its (empty) per-client state a dict, as the extending guide's example once had
    def init(self, params, num_clients):
        return ServerState(params=params, clients={})


class _UndeclaredClients(FedAvg):  # typed, but `Clients` left the base's: its checkpoint would not read back
    def init(self, params, num_clients):
        return ServerState(params=params, clients=_Point(w=stack(params, num_clients)))


@pytest.mark.parametrize("kind, words", [
    (_DictLocal, "its client_init returns the round's Local as a dict; declare a NamedTuple of its fields "
                 "stacked over the round's clients with `opt: dict = {}` last"),
    (_LocalWithoutOpt, "its client_init returns the round's Local as a _NoOpt without the field opt; declare"),
    (_DictClients, "its init returns ServerState.clients as a dict; declare the per-client state as a NamedTuple"),
    (_UndeclaredClients, "its init returns ServerState.clients as a _Point but the class declares "
                         "Clients = NoClients; set Clients = _Point on the class"),
], ids=["dict-local", "local-without-opt", "dict-clients", "undeclared-clients"])
def test_hooks_that_return_untyped_state_are_refused_in_one_line(kind, words):
    """Each hook's untyped result: one line naming the class, the hook and the fix, and the guide."""
    algo = kind()
    with pytest.raises(ConfigError) as e:
        check_typed(algo, params_of(MLP(6, 3, hidden=[5])))
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"algo class {__name__}.{kind.__qualname__}: ") and words in line, line
    assert line.endswith("see docs/extending.md"), line


class _DrawsAtInit(FedAvg):  # its init draws from the global random stream (a user's random start)
    def init(self, params, num_clients):
        return ServerState(params={k: v + torch.rand(v.shape) for k, v in params.items()})


def test_the_base_default_state_passes_and_the_check_leaves_the_random_stream():
    """The base's own state (FedAvg's: no per-client state, `NoClients`; a `BatchNormLocal` round) passes,
    and the check's hooks leave the global random stream where it was (the run's draws come after it)."""
    params = params_of(MLP(6, 3, hidden=[5]))
    assert FedAvg().init(params, 3).clients == NoClients()
    before = torch.get_rng_state()
    for kind in (FedAvg, _DrawsAtInit):
        check_typed(kind(), params)
        assert torch.equal(torch.get_rng_state(), before), kind


def test_a_users_dict_local_stops_the_command_before_any_work(tmp_path, monkeypatch):
    """`fedrun algo=<a user's algorithm returning a dict Local>`: exit status 2, one line, no run folder."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "user_dict_algo.py").write_text(
        "from fedrun.algorithms.fedavg import FedAvg\nfrom fedrun.engine.tree import stack\n\n\n"
        "class Mine(FedAvg):\n    def client_init(self, state, clients, rnd):\n"
        "        return {'params': stack(state.params, len(clients))}\n")
    monkeypatch.syspath_prepend(str(code))
    (tmp_path / "my_conf" / "algo").mkdir(parents=True)
    (tmp_path / "my_conf" / "algo" / "mine.yaml").write_text("_target_: user_dict_algo.Mine\nlr: 0.1\n")
    sys.modules.pop("user_dict_algo", None)
    r = fedrun(["data.num_clients=4", "rounds=1", "clients_per_round=2", "progress=false", "algo=mine",
                f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    lines = [line for line in r.stderr.strip().splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("fedrun: error: algo class user_dict_algo.Mine: its client_init returns the "
                               "round's Local as a dict"), lines[0]
    assert not (tmp_path / "run").exists()

"""fedrun as a package: one list of options that do not change the numbers, configs shipped in the
wheel, user configs through Hydra's search path, one source of defaults, rough edges."""
import os

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from fedrun import outputs
from fedrun.config import CONF_DIR, NEUTRAL_OPTIONS
from fedrun.errors import ConfigError
from fedrun.report.jobs import NEUTRAL_KEYS
from fedrun.run.resume import find_resume_point, fingerprint


def composed(*overrides, hydra_node=False):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra_node)


def test_one_list_of_options_that_do_not_change_the_numbers():
    cfg = composed("data=cifar10_acid", hydra_node=True)
    assert list(cfg.hydra.job.config.override_dirname.exclude_keys) == ["seed", *NEUTRAL_OPTIONS]
    assert NEUTRAL_KEYS == {"seed", *NEUTRAL_OPTIONS}
    fp = fingerprint(composed("data=cifar10_acid"))
    assert "download" not in fp["data"] and "root" not in fp["data"] and "device" not in fp and "seed" in fp
    assert "_target_" in fp["data"] and fp["tau"] == 10


def _checkpoint(tmp_path, cfg, config=None):
    outputs.save_checkpoint(str(tmp_path / "checkpoints"), 5, {
        "config": fingerprint(cfg) if config is None else config, "state": {}, "transmitted": 0, "history": []})


def test_resume_after_adding_data_download_false_is_accepted(tmp_path):
    _checkpoint(tmp_path, composed("data=cifar10_acid", "rounds=10"))
    ck = find_resume_point(composed("data=cifar10_acid", "rounds=10", "data.download=false", "device=cpu"),
                           str(tmp_path))
    assert ck is not None and ck["round"] == 5
    with pytest.raises(ConfigError, match=r"different configuration \(tau: 10 -> 5\)"):
        find_resume_point(composed("data=cifar10_acid", "rounds=10", "tau=5"), str(tmp_path))


def test_checkpoint_of_an_older_fingerprint_with_more_options_is_accepted(tmp_path):
    cfg = composed("data=cifar10_acid")
    old = OmegaConf.to_container(cfg, resolve=True)  # what older fedrun stored: data.download, data.root, ...
    old.pop("resume")
    _checkpoint(tmp_path, cfg, config=old)
    assert find_resume_point(composed("data=cifar10_acid", "data.download=false"), str(tmp_path)) is not None


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["rounds=1", "tau=1", "data.num_clients=4", "clients_per_round=2", "device=cpu", "progress=false", "plot=false"]


# test_cli.py's run: data.seed=9 draws 2,435 synthetic rows for 6 clients; the figure is drawn
TWO_ROUNDS = ["data.num_clients=6", "data.seed=9", "rounds=2", "tau=2", "clients_per_round=3", "progress=false"]


@pytest.fixture(scope="module")
def wheel_run(tmp_path_factory):
    """`pip wheel` + `pip install --target`, then `python -m fedrun.cli TWO_ROUNDS` from an empty folder,
    off the repository: (the install folder, the empty folder with the run in run/)."""
    import shutil
    import subprocess
    import sys

    tmp_path = tmp_path_factory.mktemp("wheel")
    src = tmp_path / "src"  # a copy, so the build leaves nothing in the repository
    for name in ("fedrun", "conf"):
        shutil.copytree(os.path.join(REPO, name), src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO, name), src / name)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", str(src), "-w", str(tmp_path / "dist")],
                   check=True, capture_output=True, cwd=tmp_path)
    wheel, = (tmp_path / "dist").glob("fedrun-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(tmp_path / "site"), str(wheel)],
                   check=True, capture_output=True, cwd=tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "OMP_NUM_THREADS": "1", "FEDRUN_CACHE": str(empty / "c")}
    r = subprocess.run([sys.executable, "-m", "fedrun.cli", *TWO_ROUNDS, "hydra.run.dir=run"], cwd=empty, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "outputs in" in r.stdout
    return tmp_path / "site", empty


def test_wheel_ships_the_configs_and_runs_from_an_empty_folder(wheel_run):
    site, empty = wheel_run
    assert (site / "fedrun" / "conf" / "algo" / "fedavg.yaml").is_file()
    assert (empty / "run" / "metrics.csv").is_file()
    assert str(site / "fedrun" / "conf") in (empty / "run" / ".hydra" / "hydra.yaml").read_text()


def test_two_round_run_writes_its_files_and_repeats_exactly(wheel_run, tmp_path):
    """Smoke test: the first run is `python -m fedrun.cli` in a new process (the wheel's), the second in this one."""
    import json

    import pandas as pd
    from helpers import fedrun

    a, b = wheel_run[1] / "run", tmp_path / "run1"
    r = fedrun([*TWO_ROUNDS, f"hydra.run.dir={b}", "plot=false"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "outputs in" in r.stdout
    metrics = pd.read_csv(a / "metrics.csv")
    assert list(metrics["round"]) == [1, 2]
    for col in ("models_transmitted", "train_loss", "global_acc", "global_acc_min", "pers_acc", "pers_acc_max",
                "pers_loss"):
        assert col in metrics
    assert list(metrics["models_transmitted"]) == [3, 6]
    clients = pd.read_csv(a / "clients.csv")
    assert len(clients) == 6 and {"global_acc", "pers_acc", "n_train", "n_test"} <= set(clients)
    part = pd.read_csv(a / "partition.csv")
    assert (part[[f"train_label_{j}" for j in range(10)]].sum(axis=1) == part["n_train"]).all()
    summary = json.loads((a / "summary.json").read_text())
    assert summary["pers_acc_last_round"] == pytest.approx(metrics["pers_acc"].iloc[-1], abs=1e-6)
    assert summary["pers_acc_best_round"] == pytest.approx(metrics["pers_acc"].max(), abs=1e-6)
    assert (a / "metrics.png").stat().st_size > 1000
    for f in ("metrics.csv", "clients.csv", "partition.csv"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


USER_ALGO = '''
import torch
from fedrun.algorithms.base import Algorithm
from fedrun.algorithms.checks import check_positive


class SignSGD(Algorithm):
    """Local steps along the sign of the gradient; serves the global model only."""

    name = "signsgd"

    def __init__(self, lr: float):
        check_positive("algo.lr", lr)
        self.lr = lr

    def client_step(self, engine, local, batches, rnd):
        (x, y), = batches
        g, _ = engine.grad(local.params, x, y)
        return local._replace(params={k: v - self.lr * torch.sign(g[k]) for k, v in local.params.items()})
'''


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    """A user's own algorithm: one module and one yaml in a folder of their own, nothing else edited."""
    (tmp_path / "my_algos.py").write_text(USER_ALGO)
    (tmp_path / "my_conf" / "algo").mkdir(parents=True)
    (tmp_path / "my_conf" / "algo" / "signsgd.yaml").write_text("_target_: my_algos.SignSGD\nlr: 0.01\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_an_algorithm_from_a_user_folder_runs_through_the_search_path(user_folder):
    from fedrun.run.checks import precheck
    from fedrun.run.runner import run

    args = ["algo=signsgd", "hydra.searchpath=[file://my_conf]", *SMALL]
    assert precheck(args) is None
    assert "signsgd" in precheck(["algo=nope", "hydra.searchpath=[file://my_conf]"])
    assert "its options: lr" in precheck(["algo=signsgd", "algo.beta=1", "hydra.searchpath=[file://my_conf]"])
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[*args, f"cache_dir={user_folder / 'cache'}"])
    summary = run(cfg, str(user_folder / "run"))
    assert summary["status"] == "finished" and "global_acc_last_round" in summary
    assert (user_folder / "run" / "metrics.csv").read_text().count("\n") == 2


def _algo_names():
    from fedrun.config import group_options

    return group_options("algo")


def _state(obj):
    """An algorithm's settings, nested objects (its adaptation) included, for comparison."""
    if hasattr(obj, "__dict__"):
        return (type(obj).__name__, {k: _state(v) for k, v in vars(obj).items()})
    return obj


@pytest.mark.parametrize("name", _algo_names())
def test_python_construction_equals_the_command_line_algorithm(name):
    """Every conf/algo yaml: hydra's instantiate equals the class called with no argument (its
    options come from that yaml, the one source of defaults), and the class has no defaults."""
    import inspect

    from hydra.utils import get_class, instantiate

    from fedrun.algorithms.options import BASE_OPTIONS, signature_options

    node = OmegaConf.load(os.path.join(CONF_DIR, "algo", f"{name}.yaml"))
    cls = get_class(node._target_)
    assert all(p.default is inspect.Parameter.empty for p in signature_options(cls).values())
    # (the base options, e.g. local_epochs, where the class's own signature does not take them)
    assert set(signature_options(cls)) | set(BASE_OPTIONS) == {k for k in node if not k.startswith("_")}
    assert _state(instantiate(node)) == _state(cls())


def test_the_list_of_algorithms_is_conf_algo(user_folder):
    from fedrun.algorithms import build, names
    from fedrun.config import search_roots

    assert names() == sorted(f[:-5] for f in os.listdir(os.path.join(CONF_DIR, "algo")))
    assert build("perfedavg", beta=0.5).beta == 0.5 and build("perfedavg").variant == "fo"
    roots = search_roots(["hydra.searchpath=[file://my_conf]"])
    assert "signsgd" in names(roots) and build("signsgd", roots).lr == 0.01
    with pytest.raises(ConfigError, match=f"algo='signsgd' is not a known algo; choose one of: {', '.join(names())}$"):
        build("signsgd")


def test_defaults_that_used_to_disagree_now_come_from_the_yaml():
    from fedrun.algorithms.perfedavg import PerFedAvg
    from fedrun.algorithms.pfldyn import PFLDyn
    from fedrun.algorithms.pflscaf import PFLScaf

    assert PerFedAvg().beta == 0.02 and PFLDyn().alpha == 0.1
    p = PFLScaf()
    assert (p.lr_decay, p.weight_decay, p.clip, p.adapt.inner_steps) == (0.997, 0.001, 10, 1)
    assert PerFedAvg(beta=0.5).beta == 0.5


@pytest.mark.parametrize("args, expected", [
    (["algo.beta=abc"], "fedrun: error: algo.beta='abc' must be a number > 0 or null"),  # the range check speaks first
    (["algo.lr=abc"], "fedrun: error: algo.lr='abc' must be a number > 0"),
    (["algo=pfedme", "algo.train_all=yes"], "fedrun: error: algo.train_all='yes' must be true or false or null"),
    (["algo=pavg", "algo.test_steps=2.5"], "fedrun: error: algo.test_steps=2.5 must be an integer >= 1"),
    (["algo=pfldyn", "algo.first_order=1"], "fedrun: error: algo.first_order=1 must be true or false"),
    (["sampling=shuffle"],
     "fedrun: error: sampling='shuffle' is not allowed; choose one of: replacement, epochs, steps"),
    (["+algo.gamma=1"], "fedrun: error: algo.gamma is not an option of PerFedAvg; its options: alpha, beta, delta, "
                        "finetune_epochs, finetune_lr, finetune_steps, local_epochs, lr, outer_step_from, test_time, "
                        "variant"),
])
def test_wrong_types_and_unknown_keys_get_one_line(args, expected, tmp_path, capsys):
    import fedrun.config  # noqa: F401 - registers the resolvers the config uses
    from fedrun.run.runner import run

    cfg = composed(*args, "rounds=1", "device=cpu")
    with pytest.raises(ConfigError) as e:
        run(cfg, str(tmp_path))
    assert f"fedrun: error: {e.value}" == expected


def test_a_model_that_does_not_fit_the_data_gets_one_line(tmp_path):
    from fedrun.run.runner import run

    with pytest.raises(ConfigError) as e:
        run(composed("model=cnn", "rounds=1", "device=cpu", f"cache_dir={tmp_path}"), str(tmp_path / "run"))
    msg = str(e.value)
    assert "\n" not in msg and "does not fit data=synthetic" in msg and "shape [60]" in msg
    assert msg.endswith("models that fit it: dnn, mlp, mlp_bn, mlr")


class _NotPlain:
    pass


def test_checkpoints_load_tensors_only_and_refuse_pickled_objects(tmp_path):
    import torch

    folder = str(tmp_path / "checkpoints")
    good = {"config": {"a": [1, 2]}, "state": {"params": {"w": torch.ones(2)}}, "history": [{"round": 1, "x": 0.5}]}
    outputs.save_checkpoint(folder, 1, good)
    ck = outputs.load_checkpoint(folder)
    assert ck["round"] == 1 and torch.equal(ck["state"]["params"]["w"],
                                            torch.ones(2)) and ck["history"] == good["history"]
    outputs.save_checkpoint(folder, 2, {**good, "extra": _NotPlain()})  # newest: holds a pickled object
    warnings = []
    assert outputs.load_checkpoint(folder, warn=warnings.append)["round"] == 1  # refused, falls back to round 1
    assert len(warnings) == 1 and "round_0000002.pt" in warnings[0]
    assert "objects other than tensors and plain containers; refused" in warnings[0]
    os.remove(os.path.join(folder, "round_0000001.pt"))
    with pytest.raises(outputs.CheckpointError, match="no readable checkpoint"):
        outputs.load_checkpoint(folder, warn=warnings.append)


def test_metrics_keep_full_float_precision(tmp_path):
    import csv

    row = {"round": 1, "loss": 3e-7, "acc": 0.1 + 0.2, "big": 123456.789012345}
    log = outputs.CsvLog(str(tmp_path / "m.csv"), list(row))
    log.write(row)
    log.close()
    outputs.write_csv(str(tmp_path / "w.csv"), [row])
    for name in ("m.csv", "w.csv"):
        back, = csv.DictReader(open(tmp_path / name))
        assert [float(back[k]) for k in ("loss", "acc", "big")] == [3e-7, 0.1 + 0.2, 123456.789012345]


def test_summary_md_leads_with_the_columns_a_reader_compares():
    import pandas as pd

    from fedrun.report import Group, Job, markdown, summarize

    def job(seed, accs):
        m = pd.DataFrame({"round": [1, 2], "models_transmitted": [2, 4]})
        for p in ("global", "pers"):
            m[f"{p}_acc"], m[f"{p}_acc_min"], m[f"{p}_acc_max"] = accs, [a - 0.1 for a in accs], [a + 0.1 for a in accs]
        return Job(path=f"j{seed}", seed=seed, metrics=m)

    table = summarize([Group("algo=fedavg", {"algo": "fedavg"}, [job(0, [0.5, 0.6]), job(1, [0.7, 0.6])])], [])
    head = markdown(table, [], [], [], "t").splitlines()[4]
    assert head == ("| configuration | seeds | rounds | global model: last round | global model: best round | "
                    "global model: lowest client | personalized: last round | personalized: best round | "
                    "personalized: lowest client |")
    assert {"global_acc_client_max_last_round_mean", "pers_acc_client_min_best_round_std"} <= set(table.columns)


def test_fedrun_conf_path_adds_the_users_folders_unless_the_command_line_sets_them(user_folder):
    from fedrun.config import with_env_searchpath
    from fedrun.run.checks import precheck

    env = {"FEDRUN_CONF_PATH": "my_conf"}
    argv = with_env_searchpath(["algo=signsgd"], env)
    assert argv == ["algo=signsgd", f"hydra.searchpath=[file://{user_folder / 'my_conf'}]"]
    assert precheck(argv) is None and "not a known algo" in precheck(with_env_searchpath(["algo=signsgd"], {}))
    mine = ["algo=signsgd", "hydra.searchpath=[file://elsewhere]"]
    assert with_env_searchpath(mine, env) == mine

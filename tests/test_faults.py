"""Bad input, as a new user or an attacker types it: exit status 2, ONE line on stderr that names the
option, no run folder left behind, before any work (issue 25).

To cover a new option, add a row to CASES: the arguments and the option its line must name.
`test_every_top_level_option_has_a_row` fails until every option of conf/config.yaml has one.
`{tmp}` in an argument is the test's temporary folder; `{file}` a file in it."""
import os

import pytest
from helpers import fedrun
from omegaconf import OmegaConf

from fedrun.config import CONF_DIR

# data.seed=9: a tiny synthetic dataset (6 clients); every case fails before it trains
TINY = ["data.num_clients=6", "data.seed=9", "rounds=2", "tau=2", "clients_per_round=3", "progress=false", "plot=false"]

CASES = [  # (arguments, the option the error line names)
    (["rounds=0"], "rounds"),
    (["rounds=abc"], "rounds"),
    (["tau=0"], "tau"),
    (["tau=1000000000"], "tau"),                         # a round's minibatch draws would not fit in memory
    (["clients_per_round=0"], "clients_per_round"),
    (["clients_per_round=100"], "clients_per_round"),    # more than the data's clients
    (["frac=1.5"], "frac"),
    (["batch_size=-1"], "batch_size"),
    (["eval_every=0"], "eval_every"),
    (["checkpoint_every=-1"], "checkpoint_every"),
    (["checkpoint_minutes=-1"], "checkpoint_minutes"),
    (["threads=abc"], "threads"),
    (["optim.momentum=-1"], "optim"),                    # the local optimizer (optim.*)
    (["optim.name=sgdx"], "optim"),
    (["max_chunks=0"], "max_chunks"),
    (["client_chunk=0"], "client_chunk"),
    (["memory=abc"], "memory"),
    (["memory=-8"], "memory"),
    (["personalize_batch=0"], "personalize_batch"),
    (["seed=-1"], "seed"),
    (["sampling=shuffle"], "sampling"),
    (["aggregate=mean"], "aggregate"),
    (["protocol=mine"], "protocol"),
    (["engine=fast"], "engine"),
    (["device=tpu"], "device"),
    (["on_diverge=ignore"], "on_diverge"),
    (["progress=no"], "progress"),                       # Hydra reads it as the string 'no'
    (["plot=no"], "plot"),
    (["plot_format=jpg"], "plot_format"),
    (["compile=fast"], "compile"),
    (["precision=fp16"], "precision"),
    (["resume=maybe"], "resume"),
    (["algo=fedavg,fedbn", "algo.alpha=null"], "algo.alpha"),  # a swept group: the option must exist in each
    (["resume={tmp}/no_such_run"], "resume"),
    (["resume={file}"], "resume"),                       # a file that is no checkpoint
    (["cache_dir={file}"], "cache_dir"),
    (["algo=nope"], "algo"),
    (["algo.beta=abc"], "algo.beta"),
    (["+algo.gamma=1"], "algo.gamma"),
    (["data=nope"], "data"),
    (["data.num_clients=0"], "data.num_clients"),
    (["data.num_clients=1000000"], "data.num_clients"),  # the generator would draw more than memory holds
    (["data.alpha=-1"], "data.alpha"),
    (["data.train_frac=2"], "data.train_frac"),
    # the one name, in the message
    (["data=mnist_pfedme", "data.root={tmp}/none", "data.download=false"], "dataset.root"),
    (["data=mnist_pfedme", "dataset.root={tmp}/none", "data.download=false"], "dataset.root"),
    (["data=cifar10_alid", "+model.num_classes=3"], "model.num_classes"),  # would be recorded, never used
    (["model=nope"], "model"),
    (["model.hidden=[-5]"], "model.hidden"),
    (["model.hidden=[0]"], "model.hidden"),
    (["model.hidden=abc"], "model.hidden"),
    (["model=cnn", "model.in_channels=-1"], "model.in_channels"),  # torch refuses the layer: one line too
    (["algo=perfedavg", "algo.variant=exact", "model=mlp_bn"], "algo.variant=exact"),  # an HVP through batch stats
    (["bn=shared"], "bn"),
    (["experiment=nope"], "experiment"),
    (["+bogus=1"], "bogus"),
    (["bogus=1"], "bogus"),
    (["algo=fedper", "model=mlr"], "algo=fedper"),       # a one-layer model has no body to share
    (["algo=lgfedavg", "model=mlr"], "algo=lgfedavg"),
    (["algo=fedbn"], "algo=fedbn"),                      # FedBN needs BatchNorm layers to keep local
    (["algo=pavg", "model=mlp_bn"], "algo=pavg"),        # an algorithm that does not handle BatchNorm (MAML's)
]


@pytest.mark.parametrize("args, option", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_one_line_naming_the_option_and_leaves_no_folder(args, option, tmp_path):
    (tmp_path / "a_file").write_text("not a folder, not a checkpoint\n")
    args = [a.format(tmp=tmp_path, file=tmp_path / "a_file") for a in args]
    run_dir = tmp_path / "run"
    r = fedrun([*TINY, *args, f"hydra.run.dir={run_dir}"], tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith("fedrun: error: "), r.stderr
    assert option in lines[0], lines[0]
    assert not run_dir.exists(), sorted(os.listdir(run_dir))


def test_every_top_level_option_has_a_row():
    top = OmegaConf.load(os.path.join(CONF_DIR, "config.yaml"))
    named = {option for _, option in CASES}
    assert sorted(k for k in top if k not in ("defaults", "hydra") and k not in named) == []


@pytest.mark.parametrize("args, says", [
    (["frac=0.5", "clients_per_round=3"], "clients_per_round=3 is ignored"),
    (["batch_size=5000"], "larger than every client's training rows"),
])
def test_settings_that_run_but_likely_not_as_meant_get_a_warning(args, says, tmp_path):
    r = fedrun([*TINY, "rounds=1", *args, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert [line for line in r.stderr.splitlines() if line.startswith("fedrun: warning:") and says in line]


# ---------------------------------------------------------------- the other console scripts' options

CONSOLE = [  # (console script, its arguments, the option its line must name)
    ("fedrun-bench", ["--rounds", "-1"], "--rounds"),
    ("fedrun-bench", ["--warmup", "-1"], "--warmup"),
    ("fedrun-bench", ["--tau", "0"], "--tau"),
    ("fedrun-bench", ["--repeats", "0"], "--repeats"),
    ("fedrun-bench", ["--rounds", "abc"], "--rounds"),           # argparse's own errors: one line too
    ("fedrun-bench", ["--setting", "nope"], "--setting"),
    ("fedrun-bench", ["--bogus"], "--bogus"),
    ("fedrun-bench", ["--repeats", "2", "--seeds", "1,2"], "--repeats"),
    ("fedrun-bench", ["--device", "cuda"], "--device"),               # no GPU (the test hides any there is)
    ("fedrun-data", ["--clients", "abc"], "--clients"),
    ("fedrun-data", ["--clients", "-1"], "--clients"),
    ("fedrun-data", ["--bogus"], "--bogus"),
    ("fedrun-data", ["data.num_clients=0"], "data.num_clients"),
    ("fedrun-data", ["+bogus=1"], "bogus"),
    ("fedrun-report", [], "dirs"),
    ("fedrun-report", ["{tmp}", "--bogus"], "--bogus"),
    ("fedrun-report", ["{tmp}", "--target", "abc"], "--target"),
    ("fedrun-report", ["{tmp}/none"], "{tmp}/none"),
]


def _console_main(script: str):
    if script == "fedrun-bench":
        from fedrun.bench.cli import main
    elif script == "fedrun-data":
        from fedrun.data_cli import main
    else:
        from fedrun.report import main
    return main


@pytest.mark.parametrize("script, args, option", CONSOLE, ids=[f"{s} {' '.join(a)}" for s, a, _ in CONSOLE])
def test_console_script_errors_are_one_line_naming_the_option(script, args, option, tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without a GPU
    args = [a.format(tmp=tmp_path) for a in args]
    try:
        code = _console_main(script)(args)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith(f"{script}: error: "), err
    assert option.format(tmp=tmp_path) in err[0], err


# ---------------------------------------------------------------- LEAF's JSON user files

LEAF_DAMAGE = [
    (lambda raw: raw[: len(raw) // 2], "not valid JSON"),                          # a torn copy
    (lambda raw: b"[1, 2, 3]", "not a LEAF user file"),                              # JSON, not LEAF's
    (lambda raw: raw.replace(b'"user_data"', b'"userdata"'), "not a LEAF user file"),
    (lambda raw: raw.replace(b'"y": [', b'"y": [7, ', 1), "rows of x but"),        # x and y disagree
]


def _damaged_leaf(root, damage):
    from helpers import write_leaf

    write_leaf(str(root), writers=4)
    path = root / "femnist" / "data" / "train" / "all_data_1_niid_train.json"
    path.write_bytes(damage(path.read_bytes()))
    return path


@pytest.mark.parametrize("damage, says", LEAF_DAMAGE)
def test_a_corrupt_leaf_json_file_is_one_line_naming_it_and_the_fix(damage, says, tmp_path):
    from fedrun.data.datasets.leaf import load_leaf
    from fedrun.errors import DataCorruptError

    path = _damaged_leaf(tmp_path, damage)
    with pytest.raises(DataCorruptError) as e:  # a DataMissingError: fedrun exits 2 on it, before any work
        load_leaf(str(tmp_path), "femnist")
    msg = str(e.value)
    assert str(path) in msg and says in msg and "preprocess.sh again" in msg and "\n" not in msg, msg


def test_a_torn_leaf_file_stops_fedrun_in_one_line(tmp_path):
    path = _damaged_leaf(tmp_path / "leaf", LEAF_DAMAGE[0][0])
    run_dir = tmp_path / "run"
    r = fedrun(["dataset=femnist", f"dataset.root={tmp_path / 'leaf'}", "partition=natural", "rounds=1",
                "clients_per_round=2", "progress=false", "plot=false", f"hydra.run.dir={run_dir}"], tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("fedrun: error: "), r.stderr
    assert str(path) in lines[0] and "not valid JSON" in lines[0], lines[0]
    assert not run_dir.exists()

"""Bad input, as a new user or an attacker types it: exit status 2, ONE line on stderr that names the
option, no run folder left behind, before any work (issue 25).

To cover a new option, add a row to CASES: the arguments and the option its line must name.
`test_every_top_level_option_has_a_row` fails until every option of conf/config.yaml has one.
`{tmp}` in an argument is the test's temporary folder; `{file}` a file in it."""
import os

import pytest
from omegaconf import OmegaConf

from fedrun.cli import CONF_DIR
from helpers import fedrun

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
    (["max_chunks=0"], "max_chunks"),
    (["client_chunk=0"], "client_chunk"),
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
    (["resume=maybe"], "resume"),
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
    (["data=mnist_pfedme", "data.root={tmp}/none", "data.download=false"], "data.root"),
    (["data=cifar10_alid", "+model.num_classes=3"], "model.num_classes"),  # would be recorded, never used
    (["model=nope"], "model"),
    (["model.hidden=[-5]"], "model.hidden"),
    (["model.hidden=[0]"], "model.hidden"),
    (["model.hidden=abc"], "model.hidden"),
    (["experiment=nope"], "experiment"),
    (["+bogus=1"], "bogus"),
    (["bogus=1"], "bogus"),
    (["algo=fedper", "model=mlr"], "algo=fedper"),       # a one-layer model has no body to share
    (["algo=lgfedavg", "model=mlr"], "algo=lgfedavg"),
    (["algo=fedbn"], "algo=fedbn"),                      # FedBN needs BatchNorm layers to keep local
    (["algo=fedprox", "model=mlp_bn"], "algo=fedprox"),  # an algorithm that does not handle BatchNorm
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


def test_bench_options_out_of_range_are_one_line(capsys):
    from fedrun.bench import main

    for argv, option in ((["--rounds", "-1"], "--rounds"), (["--warmup", "-1"], "--warmup"), (["--tau", "0"], "--tau")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and option in err[0], err


@pytest.mark.parametrize("args, says", [
    (["frac=0.5", "clients_per_round=3"], "clients_per_round=3 is ignored"),
    (["batch_size=5000"], "larger than every client's training rows"),
])
def test_settings_that_run_but_likely_not_as_meant_get_a_warning(args, says, tmp_path):
    r = fedrun([*TINY, "rounds=1", *args, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert [line for line in r.stderr.splitlines() if line.startswith("fedrun: warning:") and says in line]

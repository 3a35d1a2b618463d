"""The command line as a user runs it: configs compose, a short run writes what it promises, bad
input gets one line naming the option and what is allowed.

The CLI runs in this process (helpers.fedrun: fedrun.cli.main with the arguments in sys.argv); a smoke
test starts it as a user does, `python -m fedrun.cli`, with a bad input. (A run in a new process, its files
and its repeat in this one: tests/test_package.py, from the installed wheel.)"""
import pandas as pd
import pytest
from helpers import fedrun, fedrun_subprocess
from helpers import group_options as options
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from fedrun.config import CONF_DIR
from fedrun.run.checks import precheck

# data.seed=9: 2,435 synthetic rows for 6 clients (the default seed 0 draws 48,930)
SMALL = ["data.num_clients=6", "data.seed=9", "rounds=2", "tau=2", "clients_per_round=3", "progress=false"]


# Each algo and each model composed once: their groups are independent (no algo yaml names a model
# or interpolates into one), so the algo x model product would compose the same nodes again. Which
# algorithm runs on which model is the engine-agreement tests' matter (fedrun.bench.agreement).
@pytest.mark.parametrize("group, option",
                         [("algo", a) for a in options("algo")] + [("model", m) for m in options("model")])
def test_every_config_composes_and_instantiates(group, option):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[f"{group}={option}"])
    algo = instantiate(cfg.algo)
    assert group != "algo" or algo.name == option
    net = instantiate(cfg.model, in_features=60, num_classes=10)
    assert type(net).__name__ == cfg.model._target_.rsplit(".", 1)[1]
    assert sum(p.numel() for p in net.parameters()) > 0


@pytest.mark.parametrize("data", options("data"))
def test_every_data_config_composes(data):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[f"data={data}"])
    assert cfg.data._target_.startswith("fedrun.data.")


def test_overrides_reach_the_run(tmp_path):
    r = fedrun([*SMALL, "algo=fedavg", "algo.beta=0.05", "engine=loop", "batch_size=5", "frac=0.5", "device=cpu",
                f"hydra.run.dir={tmp_path / 'o'}"], tmp_path)
    assert r.returncode == 0, r.stderr
    metrics = pd.read_csv(tmp_path / "o" / "metrics.csv")
    assert list(metrics["models_transmitted"]) == [3, 6]  # frac 0.5 of 6 clients


@pytest.mark.parametrize("args, expected", [
    (["algo=nope"], "algo='nope' is not a known algo; choose one of: " + ", ".join(options("algo"))),  # conf/algo
    (["data=cifar5"], "data='cifar5' is not a known data; choose one of:"),
    (["tau=-1"], "tau=-1 must be an integer >= 1"),
    (["rounds=0"], "rounds=0 must be an integer >= 1"),
    (["frac=1.5"], "frac=1.5 must be a fraction in (0, 1]"),
    (["frac=0"], "frac=0 must be a fraction in (0, 1]"),
    (["algo.variant=second"], "algo.variant='second' is not allowed; choose one of: fo, hf, exact"),
    (["engine=jit"], "engine='jit' is not allowed; choose one of: loop, vmap"),
    (["device=tpu"], "device='tpu' is not allowed; choose one of: auto, cpu, cuda, cuda:N"),
    (["clients_per_round=7"], "clients_per_round=7 exceeds the 6 clients of the data; allowed: 1..6"),
    (["taux=3"], "unknown option 'taux'; top-level options:"),
    (["optim.bogus=1"], "optim.bogus is not an option of optim; its options: betas, eps, gamma, lr_min, momentum"),
    (["+optim.bogus=1"], "optim.bogus is not an option of optim; its options: betas, eps, gamma, lr_min, momentum"),
    (["algo=mine"], "(your own: algo/mine.yaml in a folder given by hydra.searchpath=[file://DIR] or FEDRUN_CONF_PATH"),
    (["dataset=mine", "hydra.searchpath=[file://my_conf]"], "(dataset/mine.yaml is in none of the config folders: "),
    (["algo=fedavg", "algo.variant=fo"], "algo.variant is not an option of algo=fedavg; its options: alpha, beta"),
    (["data.iid=true"], "data.alpha=0.5: must be 0 with data.iid=true"),
    # runs that trained nothing, or a part of the model, and exited 0 (issue 46)
    (["algo=fedamp", "algo.local_epochs=1", "batch_size=100000"], "batch_size=100000 is larger than every training "
     "client's rows (largest: "),
    (["algo=fedrep"], "algo.head_steps=5 with tau=2 never trains algo=fedrep's body"),  # its yaml's head_steps
    (["algo=fedpac"], "algo.head_steps=5 with tau=2 never trains algo=fedpac's body"),
    (["algo=fedala", "algo.layer_idx=5"], "algo.layer_idx=5 exceeds this model's 4 parameter tensors; allowed: 0..4"),
    # killed by the OOM killer at ~10 GB: passes of minibatches, drawn at once, on any machine's memory
    (["algo=fedamp", "algo.local_epochs=1000000000"], "algo.local_epochs=1000000000 with batch_size=20 and 3 training "
     "clients draws "),
])
def test_bad_input_gets_one_line_and_nonzero_exit(tmp_path, args, expected):
    check_one_line_error(fedrun([*SMALL, *args, f"hydra.run.dir={tmp_path / 'bad'}"], tmp_path), expected)
    assert not (tmp_path / "bad" / "metrics.csv").exists()


@pytest.mark.parametrize("args, expected", [  # Hydra's own errors: 16 and 5 lines
    (["hydra/launcher=bogus"], "hydra/launcher=bogus is not a launcher; allowed: basic, batched"),
    (["hydra/launcher=batched", "hydra.launcher.max_group=0"],
     "hydra.launcher.max_group=0 must be an integer >= 1 or null"),
])
def test_a_bad_launcher_is_one_line(tmp_path, args, expected):
    check_one_line_error(fedrun(["-m", *SMALL, "seed=0,1", *args, f"hydra.sweep.dir={tmp_path / 'bad'}"], tmp_path),
                         expected)
    assert not (tmp_path / "bad").exists()


def check_one_line_error(r, expected):
    assert r.returncode == 2
    lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("fedrun: error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in r.stderr


def test_bad_input_smoke_in_a_new_process(tmp_path):
    """Smoke test: a value only the run's validation catches (not the precheck), as a user gets it."""
    r = fedrun_subprocess([*SMALL, "frac=1.5", f"hydra.run.dir={tmp_path / 'bad'}"], tmp_path)
    check_one_line_error(r, "frac=1.5 must be a fraction in (0, 1]")


def test_a_sweep_that_lists_a_value_twice_is_one_line_before_any_job(tmp_path):
    """`seed=0,0` ran the same job twice and the summary said "seeds 2", 13.90 +- 0.00 (issue 46)."""
    for launcher in ([], ["hydra/launcher=batched"]):
        check_one_line_error(fedrun(["-m", *SMALL, "algo=fedamp", "seed=0,0", *launcher,
                                     f"hydra.sweep.dir={tmp_path / 'dup'}"], tmp_path),
                             "seed=0,0 lists 0 twice: its jobs would be the same run")
        assert not (tmp_path / "dup").exists()
    assert "lists 0.1 twice" in precheck(["-m", "algo=fedavg", "algo.beta=0.1,1e-1"])
    assert precheck(["-m", "seed=range(0,3)", "algo=fedavg,perfedavg"]) is None


def test_precheck_accepts_good_overrides():
    assert precheck(["algo=fedavg,perfedavg", "seed=0,1", "algo.beta=0.1", "hydra.run.dir=x", "-m"]) is None


def test_missing_mnist_offline_is_one_clear_line(tmp_path):
    r = fedrun([*SMALL[2:], "data=mnist_perfedavg", f"data.root={tmp_path / 'nodata'}", "data.download=false",
                f"hydra.run.dir={tmp_path / 'm'}"], tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "MNIST not found" in lines[0] and "train-images-idx3-ubyte" in lines[0], r.stderr


def _help_meaning(stdout: str, name: str) -> str:
    """The meaning `fedrun --help` prints beside `name` (on its line, or the next when the name is long)."""
    lines = stdout.splitlines()
    i = next((i for i, line in enumerate(lines) if f"{line.strip()} ".startswith(f"{name} ")), None)
    assert i is not None, f"{name} is not in the help"
    rest = lines[i].strip()[len(name):].strip()
    return rest or lines[i + 1].strip()


def _raw_comments(path) -> dict:
    """Each top-level key of a yaml file -> its inline comment, read here with a plain regex."""
    import re

    out, node = {}, None
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^(  )?([A-Za-z_]\w*):\s*([^#]*?)\s*(?:#\s*(.*))?$", line.rstrip())
        if not m:
            continue
        if m.group(1) is None:  # a top-level key; one with no value is a node (optim:) of two-space keys
            node = m.group(2) if not m.group(3) and m.group(2) not in ("defaults", "hydra") else None
            if m.group(2) not in ("defaults", "hydra", "_target_") and node is None:
                out[m.group(2)] = (m.group(3), (m.group(4) or "").strip())
        elif node is not None:
            out[f"{node}.{m.group(2)}"] = (m.group(3), (m.group(4) or "").strip())
    return out


def test_help_explains_every_option_and_lists_every_choice(tmp_path):
    """`fedrun --help`: every top-level option of conf/config.yaml with its default and the start of its
    comment (every option has one), every choice of every group, the defaults starred; no run starts."""
    import os

    r = fedrun(["--help"], tmp_path)
    assert r.returncode == 0, r.stderr
    top = _raw_comments(os.path.join(CONF_DIR, "config.yaml"))
    assert {"seed", "rounds", "tau", "device", "protocol"} <= set(top)
    for key, (default, comment) in top.items():
        assert comment, f"conf/config.yaml: {key} has no comment to explain it"
        meaning = _help_meaning(r.stdout, f"{key}={default}")
        assert meaning.startswith(" ".join(comment.split()[:4])), (key, meaning)
    for group, default in (("algo", "perfedavg"), ("data", "synthetic"), ("model", "dnn")):
        assert f"  {group}:" in r.stdout
        for name in options(group):
            assert _help_meaning(r.stdout, ("*" if name == default else "") + name), name
    for name in options("experiment") + ["*basic", "batched", "parallel", "slurm"]:
        assert _help_meaning(r.stdout, name), name
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("algo", options("algo"))
def test_algo_help_explains_each_of_its_options(algo, tmp_path):
    """`fedrun algo=X --help`: every option of conf/algo/X.yaml, its default and the start of its comment."""
    import os

    r = fedrun([f"algo={algo}", "--help"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"algo={algo} (algo/{algo}.yaml):" in r.stdout
    opts = _raw_comments(os.path.join(CONF_DIR, "algo", f"{algo}.yaml"))
    assert opts
    for key, (default, comment) in opts.items():
        assert comment, f"conf/algo/{algo}.yaml: {key} has no comment to explain it"
        meaning = _help_meaning(r.stdout, f"algo.{key}={default}")
        assert meaning.startswith(" ".join(comment.split()[:4])), (key, meaning)


def test_help_of_a_chosen_method_comes_first():
    """`fedrun algo=X --help`: the method's own options right after the usage lines, before the ~290
    lines of general options and choices (a user asked about X)."""
    from fedrun.help import help_text

    lines = help_text(["algo=fedprox", "--help"]).splitlines()
    chosen = lines.index("algo=fedprox (algo/fedprox.yaml):")
    general = lines.index("Options (key=value; default, then meaning; from conf/config.yaml):")
    assert chosen < 10 < general and any(line.strip().startswith("algo.mu=") for line in lines[chosen:general])
    assert help_text(["--help"]).splitlines().index(lines[general]) < 10  # nothing chosen: the options first


def test_help_names_every_dataset_that_partition_natural_takes():
    """partition=natural's line in `fedrun --help` names every dataset whose rows come with their own
    clients (a dataset class's has_groups), not femnist alone."""
    import re

    from hydra.utils import get_class

    from fedrun.config import group_file, load_conf
    from fedrun.help import help_text

    takes = [name for name in options("dataset") if not name.startswith("_") and
             getattr(get_class(load_conf(group_file("dataset", name))["_target_"]), "has_groups", False)]
    assert {"femnist", "shakespeare", "synthetic"} <= set(takes)
    text = " ".join(help_text(["--help"]).split())
    line = re.search(r" natural (.*?) \*?\w+ [A-Z]", text).group(1)  # up to the next choice
    assert all(name in line for name in takes), line


def _yaml_options(path) -> dict:
    """Every option of a yaml file -> (default as written, its inline comment), read here with a plain
    regex: dotted below a key that holds others (logger/mlflow.yaml: `mlflow.tracking_uri`); without
    `defaults`, `hydra`, `_target_` and a `name:` that is the file's own name (a partition's, a dataset's)."""
    import os
    import re

    out, parents, stem, skip = {}, [], os.path.basename(path)[:-len(".yaml")], None
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^(\s*)([A-Za-z_]\w*):\s*([^#]*?)\s*(?:#\s*(.*))?$", line.rstrip())
        if not m:
            continue
        indent, key, value, comment = len(m.group(1)), m.group(2), m.group(3), (m.group(4) or "").strip()
        if skip is not None and indent > skip:
            continue
        skip = None
        parents = [(i, k) for i, k in parents if i < indent]
        if key in ("defaults", "hydra", "_target_") or (key == "name" and not parents and value == stem):
            skip = indent
            continue
        dotted = ".".join([*(k for _, k in parents), key])
        if parents and ".".join(k for _, k in parents) in out and not out[".".join(k for _, k in parents)][0]:
            del out[".".join(k for _, k in parents)]  # a key that holds others is no option itself
        out[dotted] = (value, comment)
        parents.append((indent, key))
    return out


def _group_yamls() -> list[tuple[str, str, str]]:
    """(group, choice, path) of every yaml of conf/ but config.yaml: groups, hydra/launcher, presets (not
    _x.yaml, the nodes other yamls of the group include: conf/partition/_split.yaml)."""
    import glob
    import os

    out = []
    for path in sorted(glob.glob(os.path.join(CONF_DIR, "**", "*.yaml"), recursive=True)):
        group = os.path.relpath(os.path.dirname(path), CONF_DIR).replace(os.sep, "/")
        if group != "." and not os.path.basename(path).startswith("_"):
            out.append((group, os.path.basename(path)[:-len(".yaml")], path))
    return out


def test_every_option_in_conf_has_a_comment_that_explains_it():
    """Each option of every yaml in conf/ says what it means on its line (`fedrun GROUP=CHOICE --help`
    prints it): the paper presets only set options explained where they are defined, so they are left out."""
    missing = [f"{group}/{name}.yaml: {key}" for group, name, path in _group_yamls() if group != "experiment"
               for key, (_, comment) in _yaml_options(path).items() if not comment]
    assert not missing, "options without a comment: " + ", ".join(missing)


@pytest.mark.parametrize("group, name", [(g, n) for g, n, _ in _group_yamls() if g != "algo"],
                         ids=[f"{g}={n}" for g, n, _ in _group_yamls() if g != "algo"])
def test_every_group_choice_explains_its_options_alone(group, name, tmp_path):
    """`fedrun GROUP=CHOICE --help` with nothing else (`partition=dirichlet` needs no dataset= to be
    explained): exit 0, each option of the yaml with its default and the start of its comment; no
    run starts. (algo=X: test_algo_help_explains_each_of_its_options.)"""
    import os

    r = fedrun([f"{group}={name}", "--help"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"{group}={name} ({group}/{name}.yaml):" in r.stdout
    prefix = "" if group == "experiment" else group.replace("/", ".") + "."
    for key, (default, comment) in _yaml_options(os.path.join(CONF_DIR, group, f"{name}.yaml")).items():
        meaning = _help_meaning(r.stdout, f"{prefix}{key}={default}")  # (a preset's settings may have no comment)
        assert not comment or " ".join(comment.split()).startswith(meaning), (key, meaning)
    assert not (tmp_path / "outputs").exists()


def test_a_sweep_job_folder_name_fits_the_file_system(tmp_path):
    """A job folder is named `<num>_<its overrides>`; overrides past 255 bytes used to crash the sweep
    (OSError: File name too long). Over 200 bytes the name is cut and ends in a hash of the whole."""
    from fedrun.config import folder_name

    hidden = "[" + ",".join(["3"] * 90) + "]"
    sweep = tmp_path / "sweep"
    r = fedrun(["-m", *SMALL, "rounds=1", "plot=false", "model=mlp", f"model.hidden={hidden}",
                f"hydra.sweep.dir={sweep}", "~hydra.callbacks.sweep_report"], tmp_path)
    assert r.returncode == 0, r.stderr
    (job,) = [d for d in sweep.iterdir() if d.is_dir()]
    import re

    assert re.fullmatch(r"0_clients_per_round=3,.*,model\.hidden=\[3,3,[3,]*~[0-9a-f]{12}", job.name), job.name
    assert len(job.name.encode()) == 2 + 200 and (job / "metrics.csv").exists()
    assert folder_name("a" * 300) != folder_name("a" * 299 + "b") and folder_name("a=1") == "a=1"


@pytest.mark.parametrize("source, expected", [
    (None, "no module 'user_algo_{i}' in Python's search path (besides installed packages: "),
    ("import not_installed_anywhere\n",
     "module 'user_algo_{i}' imports 'not_installed_anywhere', which is not installed"),
    ("raise RuntimeError('broken at import')\n", "importing module 'user_algo_{i}' ({path}/user_algo_{i}.py) raised "
                                                 "RuntimeError: broken at import"),
    ("x = 1\n", "module 'user_algo_{i}' ({path}/user_algo_{i}.py) has no 'Mine'"),
], ids=["not-on-the-path", "needs-a-missing-package", "raises", "lacks-the-name"])
def test_a_user_target_that_does_not_import_is_one_line_and_leaves_no_folder(source, expected, tmp_path, monkeypatch,
                                                                             request):
    """A user's algo yaml whose `_target_` module is missing, broken or lacks the class: one line naming the
    target, the module, where Python looked and the fix (Hydra says "Error locating target ..." in four);
    the run folder Hydra made is removed."""
    import sys

    i = request.node.callspec.id.replace("-", "_")
    code = tmp_path / "code"
    code.mkdir()
    if source is not None:
        (code / f"user_algo_{i}.py").write_text(source)
        monkeypatch.syspath_prepend(str(code))
    (tmp_path / "my_conf" / "algo").mkdir(parents=True)
    (tmp_path / "my_conf" / "algo" / "mine.yaml").write_text(f"_target_: user_algo_{i}.Mine\nlr: 0.1\n")
    sys.modules.pop(f"user_algo_{i}", None)
    r = fedrun([*SMALL, "algo=mine", f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]",
                f"hydra.run.dir={tmp_path / 'run'}"],
               tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fedrun: error: algo._target_='user_algo_{i}.Mine': "), r.stderr
    assert expected.format(i=i, path=code) in lines[0], lines[0]
    assert source is not None or f"add the folder that holds user_algo_{i}.py to PYTHONPATH" in lines[0], lines[0]
    assert not (tmp_path / "run").exists()


def test_plot_format_sets_the_file_type_of_a_runs_figures(tmp_path):
    r = fedrun([*SMALL, "plot_format=svg", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert r.returncode == 0, r.stderr
    for name in ("metrics", "partition"):
        assert "<svg" in (tmp_path / "run" / f"{name}.svg").read_text()[:1000]
        assert not (tmp_path / "run" / f"{name}.png").exists()
    r = fedrun([*SMALL, "plot_format=jpg", f"hydra.run.dir={tmp_path / 'bad'}"], tmp_path)
    check_one_line_error(r, "plot_format='jpg' is not allowed; choose one of: png, pdf, svg")
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("route", [["data=mnist_perfedavg", "data.download=false"],
                                   ["experiment=pfedme_mnist_dnn_pfedme", "data.download=false"],
                                   ["dataset=mnist", "dataset.download=false"]],
                         ids=["data-preset", "paper-preset", "dataset"])
@pytest.mark.parametrize("how", ["option", "env"])
def test_dataset_root_or_fedrun_data_says_where_the_files_are_on_every_route(route, how, tmp_path):
    """One option for where data is: `dataset.root` (default $FEDRUN_DATA, else ./data) for the data=
    presets (whose own name, data.root, still works), the paper presets and dataset=; the missing files'
    message names the folder given and the option."""
    where = tmp_path / f"nowhere {how}"
    given = [f"dataset.root={where}"] if how == "option" else []
    r = fedrun([*route, *given, "rounds=1", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path,
               env={"FEDRUN_DATA": str(where if how == "env" else tmp_path / "not this one")})
    check_one_line_error(r, f"{where}/MNIST/raw")
    assert "dataset.root (or $FEDRUN_DATA)" in r.stderr
    assert not (tmp_path / "run").exists()


def test_old_data_root_of_a_data_preset_still_works(tmp_path):
    r = fedrun(["data=mnist_perfedavg", f"data.root={tmp_path / 'old'}", "data.download=false", "rounds=1",
                f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    check_one_line_error(r, f"{tmp_path / 'old'}/MNIST/raw")


def test_dataset_root_of_a_data_preset_is_its_data_root_in_job_folder_names_too():
    """The paper scripts hide every option they pass from job folder names (exclude_keys): dataset.root
    given as a preset's data.root is hidden as well; dataset= and data=synthetic are left as they are."""
    from fedrun.config import with_dataset_root

    hide = "hydra.job.config.override_dirname.exclude_keys"
    assert with_dataset_root(["-m", "data=cifar10_acid", "dataset.root=/x", f"{hide}=[seed,dataset.root]"]) == \
        ["-m", "data=cifar10_acid", "data.root=/x", f"{hide}=[seed,dataset.root,data.root]"]
    for argv in (["dataset=mnist", "dataset.root=/x"], ["data=synthetic", "dataset.root=/x"],
                 ["data=mnist_pfedme", "x=1"]):
        assert with_dataset_root(argv) == argv

"""The paper scripts in --quick mode, end to end: they train through the `fedrun` CLI, say where the
data comes from and where the outputs went, and their tables hold the numbers of the runs' CSVs.

Real MNIST is used when $FEDRUN_DATA holds it; otherwise a tiny MNIST in torchvision's raw layout
is written to a temporary folder (too small for the papers' `a`, so the scripts must lower it).

The scripts run in this process (runpy, patched argv), and so do the `python -m fedrun.cli -m ...`
sweeps they start: _paper.run_sweep's subprocess.run gets the very argv it builds and hands it to
fedrun.cli.main here (helpers.fedrun). One script error runs as a real process."""
import contextlib
import io
import json
import math
import os
import re
import runpy
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers import REPO, fedrun, write_mnist_idx
from omegaconf import OmegaConf

from fedrun.data.datasets.idx import MNIST_FILES

SCRIPTS = os.path.join(REPO, "scripts")
sys.path.insert(0, SCRIPTS)
import _paper  # noqa: E402  (the scripts' shared module: the one they import)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    real = os.environ.get("FEDRUN_DATA")
    if real and all(os.path.exists(os.path.join(real, "MNIST", "raw", f)) for f in MNIST_FILES):
        return real, True
    root = tmp_path_factory.mktemp("mnist")
    rng = np.random.RandomState(0)
    write_mnist_idx(root, rng.permutation(np.repeat(np.arange(10), 120)), rng.permutation(np.repeat(np.arange(10), 60)))
    return str(root), False


class _FedrunHere:
    """Stands in for the subprocess module in _paper: `python -m fedrun.cli ...` runs in this process."""

    @staticmethod
    def run(cmd, **kwargs):
        assert cmd[:3] == [sys.executable, "-m", "fedrun.cli"] and not kwargs, cmd
        r = fedrun(cmd[3:], os.getcwd())
        print(r.stdout, end="")
        print(r.stderr, end="", file=sys.stderr)
        return subprocess.CompletedProcess(cmd, r.returncode)


def script(name, args, tmp_path, monkeypatch):
    """`python scripts/<name> *args` in `tmp_path`, in this process; returns what it prints."""
    monkeypatch.setattr(_paper, "subprocess", _FedrunHere)
    monkeypatch.setenv("FEDRUN_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [os.path.join(SCRIPTS, name), *map(str, args)])
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(os.path.join(SCRIPTS, name), run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    assert code == 0, out.getvalue()[-3000:] + err.getvalue()[-3000:]
    return out.getvalue()


def job_metrics(runs_dir):
    """{tuple of the job's overrides without the seed: metrics DataFrame} straight from the job folders."""
    out = {}
    for d in sorted(p for p in runs_dir.iterdir() if (p / ".hydra").is_dir()):
        ov = yaml.safe_load((d / ".hydra" / "overrides.yaml").read_text())
        key = dict(o.split("=", 1) for o in ov if not o.startswith("seed="))
        out[tuple(sorted(key.items()))] = pd.read_csv(d / "metrics.csv")
    return out


def test_figure1_quick(data_root, tmp_path, monkeypatch):
    root, real = data_root
    out = tmp_path / "fig"
    # two of the paper's three (tau, r) panels (--pairs), each with another tau and r: 6 -> 4 jobs (9.6 -> 7.8 s of CPU)
    # --rounds 2 (one less than --quick's 3): still the best and the last of several rounds
    text = script("perfedavg_figure1.py", ["--quick", "--rounds", "2", "--pairs", "10:0.2,4:0.5", "--data-root", root,
                                           "--out", str(out)], tmp_path, monkeypatch)
    assert f"outputs: {out}" in text and "data: MNIST from" in text
    if not real:
        assert re.search(r"note: a=\d+ does not fit this MNIST with n=10 users; using a=\d+", text)
    assert (out / "figure1.png").stat().st_size > 10000
    assert (out / "summary.md").exists() and (out / "summary.csv").exists()
    table = pd.read_csv(out / "figure1.csv")
    assert len(table) == 6 and set(table["curve"]) == {"FedAvg", "FedAvg + update", "Per-FedAvg (FO)"}
    assert (table["rounds"] == 2).all()
    assert not (out / "runs" / "tau10_r0.5").exists()
    for tau, r in ((10, 0.2), (4, 0.5)):
        jobs = job_metrics(out / "runs" / f"tau{tau}_r{r:g}")
        assert len(jobs) == 2
        for key, m in jobs.items():
            ov = dict(key)
            assert ov["tau"] == str(tau) and float(ov["frac"]) == r and ov["algo.alpha"] == "0.01"
            assert ov["algo.beta"] == "0.001" and ov["batch_size"] == "50" and ov["data.n"] == "10"
            assert len(m) == 2
            curves = [("FedAvg", "global_acc"), ("FedAvg + update", "pers_acc")] if ov["algo"] == "fedavg" \
                else [("Per-FedAvg (FO)", "pers_acc")]
            for curve, col in curves:
                row = table[(table.tau == tau) & (table.r == r) & (table.curve == curve)].iloc[0]
                assert row["acc_last_round_mean"] == pytest.approx(m[col].iloc[-1], abs=1e-9)
                assert row["acc_best_round_mean"] == pytest.approx(m[col].max(), abs=1e-9)


def test_table003_quick_and_replot_without_training(data_root, tmp_path, monkeypatch):
    root, real = data_root
    out = tmp_path / "tab"
    # --rounds 2 (one less than --quick's 3): still the best and the last of several rounds
    text = script("perfedavg_table003.py", ["--quick", "--rounds", "2", "--data-root", root, "--out", str(out)],
                  tmp_path, monkeypatch)
    assert f"outputs: {out}" in text and "data: MNIST from" in text
    note = re.search(r"note: a=196 does not fit this MNIST with n=50 users; using a=(\d+)", text)
    assert note or real
    for reported in ("89.98", "89.35", "70.22", "60.12", "87.14", "86.38", "73.81", "72.17"):
        assert reported in text
    table = pd.read_csv(out / "table003.csv")
    assert len(table) == 4
    jobs = job_metrics(out / "runs")
    assert len(jobs) == 8
    for key, m in jobs.items():
        ov = dict(key)
        assert ov["data.n"] == "50" and ov["frac"] == "0.2" and ov["batch_size"] == "40" and ov["algo.beta"] == "0.001"
        if note:
            assert ov["data.a"] == note.group(1)
        row = table[(table.tau == int(ov["tau"])) & (table.alpha == float(ov["algo.alpha"]))].iloc[0]
        v = ov["algo.variant"]
        assert row[f"{v}_last_round"] == pytest.approx(100 * m["pers_acc"].iloc[-1], abs=1e-7)
        assert row[f"{v}_best_round"] == pytest.approx(100 * m["pers_acc"].max(), abs=1e-7)
        assert row[f"{v}_rounds"] == 2 and len(m) == 2
    # --replot redraws from the CSVs: no new run, the same table
    before = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("metrics.csv")}
    (out / "table003.csv").rename(out / "table003.first.csv")
    again = script("perfedavg_table003.py", ["--replot", str(out)], tmp_path, monkeypatch)
    assert "run: fedrun" not in again
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("metrics.csv")} == before
    assert (out / "table003.csv").read_text() == (out / "table003.first.csv").read_text()


def test_missing_data_is_one_clear_error(tmp_path):
    """A real process, as a user runs a script (the smoke test of the scripts' command line). The
    missing data is found before torch is imported (-X importtime lists every import): the error
    comes in a fraction of a second, not after torch's ~3 s import (fedrun.data imports on first use)."""
    env = {**os.environ, "FEDRUN_CACHE": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-X", "importtime", os.path.join(SCRIPTS, "perfedavg_table003.py"), "--quick",
                        "--no-download", "--data-root", str(tmp_path / "none"), "--out", str(tmp_path / "o")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    imports = [line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")]
    err = [line for line in r.stderr.splitlines() if not line.startswith("import time:")]
    assert r.returncode == 2 and len(err) == 1 and "MNIST not found" in err[0], r.stderr[-3000:]
    assert "fedrun.data.datasets.idx" in imports and "torch" not in imports
    assert not (tmp_path / "o").exists()  # the output folder it made is gone again


def test_fedrun_data_names_import_on_first_use():
    """fedrun.data's names (imported on first use) are the objects they were when the package imported
    them eagerly; `augment` stays the function, also after the submodule fedrun.data.augment is imported."""
    import fedrun.data as data
    import fedrun.data.augment
    import fedrun.data.federated
    import fedrun.data.presets

    assert data.augment is fedrun.data.augment is sys.modules["fedrun.data.augment"].augment
    assert data.FederatedData is fedrun.data.federated.FederatedData and data.cifar is fedrun.data.presets.cifar
    assert all(getattr(data, name) is not None for name in data.__all__)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        data.nope  # noqa: B018


def test_pfedme_table1_runs_on_the_authors_mnist_split(data_root, tmp_path, monkeypatch):
    root, _ = data_root
    out = tmp_path / "t1a"
    text = script("pfedme_table1.py", ["--quick", "--rounds", "1", "--datasets", "mnist", "--mnist-data",
                                       "mnist_pfedme_authors", "--protocols", "official,official_2020", "--models",
                                       "mlr",
                                       "--algos", "fedavg,perfedavg", "--data-root", root, "--out", str(out)], tmp_path,
                  monkeypatch)
    assert "fedrun data=mnist_pfedme_authors" in text and "most test rows are also training rows" in text
    jobs = {**job_metrics(out / "runs" / "mnist"), **job_metrics(out / "runs" / "mnist" / "official_2020")}
    # official_2020 differs only for Per-FedAvg: FedAvg is not run again
    assert sorted((dict(k)["experiment"].split("_")[-1], dict(k)["protocol"]) for k in jobs) == [
        ("fedavg", "official"), ("perfedavg", "official"), ("perfedavg", "official_2020")]
    for job in (p.parent for p in (out / "runs" / "mnist").rglob("metrics.csv")):
        assert "data=mnist_pfedme_authors" in (job / ".hydra" / "overrides.yaml").read_text()
    rows = {r["entry"]: r for r in pd.read_csv(out / "table1.csv").to_dict("records")}
    for proto in ("official", "official_2020"):
        m = jobs[next(k for k in jobs if dict(k)["protocol"] == proto and "perfedavg" in dict(k)["experiment"])]
        assert rows["Per-FedAvg"][f"{proto}_best"] == pytest.approx(100 * m["pers_acc"].max(), abs=1e-6)
    assert rows["FedAvg"]["official_2020_best"] == rows["FedAvg"]["official_best"]
    md = (out / "table1.md").read_text()
    assert "| official (best round) | official - paper | official_2020 (best round) |" in md


# one data set a test (the script's --datasets): two halves that the test workers run side by side
# instead of one 24-job test that ended the suite alone (79 s of the loaded 2-core run). MNIST with the
# DNN only (--models): both models' rows are synthetic's, MNIST's MLR presets run in the authors'-split
# test above (12 -> 6 jobs: 12.6 -> 7.0 s of CPU, docs/suite_durations.md). Synthetic under protocol=official
# only (--protocols): both protocols' columns are MNIST's, the same script code for either data set, and
# synthetic's official rows give the paper's ordering line below (12 -> 6 jobs)
@pytest.mark.parametrize("d, models, protocols, paper_pm_dnn", [("synthetic", "mlr,dnn", "official", "86.36"),
                                                                ("mnist", "dnn", "official,honest", "99.46")])
def test_pfedme_table1_quick(d, models, protocols, paper_pm_dnn, data_root, tmp_path, monkeypatch):
    root, real = data_root
    out = tmp_path / "t1"
    # --rounds 2 (one less than --quick's 3): still the best and the last of several rounds
    text = script("pfedme_table1.py", ["--quick", "--rounds", "2", "--datasets", d, "--models", models, "--protocols",
                                       protocols, "--data-root", root, "--out", str(out)], tmp_path, monkeypatch)
    assert f"outputs: {out}" in text and ("fedrun data=mnist_pfedme" in text) == (d == "mnist")
    if not real and d == "mnist":
        assert "NOT the full 70,000" in text
    n_models, ran = len(models.split(",")), protocols.split(",")
    table = pd.read_csv(out / "table1.csv")
    # per model: FedAvg, Per-FedAvg, pFedMe GM, pFedMe PM
    assert len(table) == 4 * n_models and set(table.dataset) == {d} and len(set(table.model)) == n_models
    for proto in ("official", "honest"):  # the columns of both, a protocol not run: 0 seeds
        assert (table[f"{proto}_seeds"] == (proto in ran)).all()
    jobs = job_metrics(out / "runs" / d)
    assert len(jobs) == 3 * n_models * len(ran)  # 3 presets a model x the protocols
    assert {dict(k)["protocol"] for k in jobs} == set(ran)
    for key, m in jobs.items():
        ov = dict(key)
        assert len(m) == 2
        _, data, model, algo = ov["experiment"].split("_")
        for entry, prefix in {"fedavg": [("FedAvg", "global")], "perfedavg": [("Per-FedAvg", "pers")],
                              "pfedme": [("pFedMe GM", "global"), ("pFedMe PM", "pers")]}[algo]:
            row = table[(table.dataset == d) & (table.model == model.upper()) & (table.entry == entry)].iloc[0]
            proto = ov["protocol"]
            assert row[f"{proto}_best"] == pytest.approx(100 * m[f"{prefix}_acc"].max(), abs=1e-6)
            assert row[f"{proto}_last"] == pytest.approx(100 * m[f"{prefix}_acc"].iloc[-1], abs=1e-6)
    md = (out / "table1.md").read_text()
    assert (f"| {d} | DNN | pFedMe PM | {paper_pm_dnn} |" in md
            and f"- {d} DNN, official: FedAvg < Per-FedAvg < pFedMe PM" in md)


# ----------------------------------------------------------------------------------------------
# paper 004 (scripts/pfl_cifar.py): --quick on tiny generated CIFAR with the algorithms fedrun has
# ----------------------------------------------------------------------------------------------

def _first_sent(m, col, target):
    hit = m[m[col] >= target]
    return hit["models_transmitted"].iloc[0] if len(hit) else math.nan


def _check_pfl_table(path, m, col, targets, baseline):
    """pfl_cifar.py's table.csv / table_lowest.csv against the jobs' metrics.csv (`m`: method ->
    one seed's), by hand: models sent until the first round whose `col[method]` reaches the target,
    over 3 devices per round; the gain: the baseline's count / the method's, a bound when one of the
    two never got there (then what it sent in all stands for its count)."""
    table = pd.read_csv(path, keep_default_na=False, na_values=["", "nan"])
    assert len(table) == len(targets) * len(m)
    for t in targets:
        rows = table[table.target_pct == round(t * 100, 4)].set_index("method")
        base = _first_sent(m[baseline], col[baseline], t) / 3
        base_all = m[baseline]["models_transmitted"].iloc[-1] / 3
        for k in m:
            sent = _first_sent(m[k], col[k], t)
            row = rows.loc[k]
            assert row["devices_per_round"] == 3 and row["curve"] == col[k].split("_")[0]
            assert row["reached"] == ("1/1" if sent == sent else "0/1")
            if sent == sent:   # transmissions relative to one round: models sent / devices per round
                assert row["transmissions_mean"] == pytest.approx(sent / 3)
                assert row["models_transmitted_mean"] == pytest.approx(sent)
            else:
                assert pd.isna(row["transmissions_mean"])
                assert row["transmissions_at_least"] == pytest.approx(m[k]["models_transmitted"].iloc[-1] / 3)
            if base == base and sent == sent:
                assert row["gain_vs_baseline"] == pytest.approx(base / (sent / 3)) and pd.isna(row["gain_bound"])
            elif sent == sent:
                assert row["gain_vs_baseline"] == pytest.approx(base_all / (sent / 3)) and row["gain_bound"] == ">"
            elif base == base:
                assert row["gain_vs_baseline"] == pytest.approx(base / row["transmissions_at_least"])
                assert row["gain_bound"] == "<"
            else:
                assert pd.isna(row["gain_vs_baseline"])
    return table


def test_pfl_cifar_quick_table_figure_and_replot(tmp_path, monkeypatch):
    out = tmp_path / "pfl"
    # --rounds 2 (one less than --quick's 3): a first round under a target and one over it (the lowest-device
    # curves below), so the tables' counts and gain bounds still have a round before the one that reaches
    args = ["--quick", "--rounds", "2", "--methods", "fedavg,fedavg_update,perfedavg_fo", "--baseline", "fedavg_update",
            "--target", "15", "87.6", "--target-lowest", "10", "15", "--out", str(out)]
    text = script("pfl_cifar.py", args, tmp_path, monkeypatch)
    assert f"outputs: {out}" in text and "tiny random CIFAR-format images" in text
    for f in ("figure2.png", "table.csv", "table.md", "table_lowest.csv", "table_lowest.md", "accuracy.csv",
              "accuracy.md", "summary.md", "settings.json"):
        assert (out / f).exists(), f
    assert (out / "figure2.png").stat().st_size > 10000
    runs = {k: job_metrics(out / "runs" / k) for k in ("fedavg", "fedavg_update", "perfedavg_fo")}
    for k, jobs in runs.items():
        assert len(jobs) == 1
        ov = dict(next(iter(jobs)))
        assert ov["data"] == "cifar10_acid" and ov["model"] == "cnn" and ov["data.classes_per_client"] == "5"
        assert ov["rounds"] == "2" and ov["clients_per_round"] == "3" and ov["tau"] == "2"
    m = {k: next(iter(j.values())) for k, j in runs.items()}
    col = {"fedavg": "global_acc", "fedavg_update": "pers_acc", "perfedavg_fo": "pers_acc"}
    table = _check_pfl_table(out / "table.csv", m, col, (0.15, 0.876), "fedavg_update")
    assert (table[table.target_pct == 87.6]["paper_transmissions"].isna()).all()  # none of the paper's methods ran
    md = (out / "table.md").read_text()
    assert md.startswith("# Paper 004 Table 1 (ACID)") and "average test accuracy" in md
    assert "| 87.6 | paper |" in md and "| 794 | 163 | 237 | 436 | 924 | 286 | 4.9× |" in md
    assert "FedAvg + update" in md and "not run" in md and "88.8" in md
    # Table 3 (lowest device): the same counts on the lowest device's accuracy, <curve>_acc_min
    low = {k: f"{c}_min" for k, c in col.items()}
    lowest = _check_pfl_table(out / "table_lowest.csv", m, low, (0.10, 0.15), "fedavg_update")
    assert lowest["paper_transmissions"].isna().all()
    md = (out / "table_lowest.md").read_text()
    assert md.startswith("# Paper 004 Table 3 (ACID)") and "lowest-performing device" in md
    assert "| paper |" not in md and "appendix" in md and "not run" not in md  # no paper columns to show
    acc = pd.read_csv(out / "accuracy.csv").set_index("method")
    for k, c in col.items():
        best = m[k][m[k][c] == m[k][c].max()].iloc[0]
        assert acc.loc[k, "acc_last_round_mean"] == pytest.approx(m[k][c].iloc[-1])
        assert acc.loc[k, "acc_best_round_mean"] == pytest.approx(m[k][c].max())
        assert acc.loc[k, "acc_client_min_last_round_mean"] == pytest.approx(m[k][f"{c}_min"].iloc[-1])
        assert acc.loc[k, "acc_client_max_best_round_mean"] == pytest.approx(best[f"{c}_max"])
    # --replot draws again from the CSVs, training nothing
    before = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("metrics.csv")}
    for f in ("table.csv", "table_lowest.csv"):
        (out / f).rename(out / f"{f}.first")
    again = script("pfl_cifar.py", ["--replot", str(out)], tmp_path, monkeypatch)
    assert "run: fedrun" not in again
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("metrics.csv")} == before
    for f in ("table.csv", "table_lowest.csv"):
        assert (out / f).read_text() == (out / f"{f}.first").read_text()
    # on tiny random data no lowest device got anywhere (every <curve>_acc_min is 0): give the runs'
    # metrics.csv lowest-device curves that reach the targets (or not) and make Table 3 again from them
    mins = {"fedavg_update": [0.0, 0.15], "perfedavg_fo": [0.1, 0.1], "fedavg": [0.0, 0.2]}
    for k, v in mins.items():
        (path,) = (out / "runs" / k).glob("*/metrics.csv")
        assert (m[k][low[k]] == 0).all()
        m[k][low[k]] = v
        m[k].to_csv(path, index=False)
    mod = _load_script("pfl_cifar.py")
    settings, targets = json.loads((out / "settings.json").read_text()), [0.10, 0.15, 0.20]
    res = mod["collect"](str(out), list(m), settings["targets"], targets)
    mod["tables"](str(out), res, settings, targets, "fedavg_update", curve="lowest")
    lowest = _check_pfl_table(out / "table_lowest.csv", m, low, targets, "fedavg_update")
    assert set(lowest["gain_bound"].fillna("")) == {"", "<", ">"}  # reached by both, the baseline only, the method only


PFL_PAPER_METHODS = ("perfedavg_maml", "pfldyn_proto", "pfldyn_maml", "pflscaf_proto", "pflscaf_maml", "pavg_proto",
                     "feddyn", "scaffold")


# the paper's 8 methods in one run of the script: two halves of 4 (--methods) paid the script's own tiny CIFAR,
# figures and tables twice (18.0 + 11.8 -> 23.4 CPU-s). The halves were for the loaded suite's wall time (one
# test of 77 s at the suite's end); test_scripts.py now runs first (conftest.py), so a long test no longer ends it
def test_pfl_cifar_quick_runs_every_paper_method(tmp_path, monkeypatch):
    methods = PFL_PAPER_METHODS
    out = tmp_path / "all"
    # --rounds 1: each preset runs through the script and counts its models a round (PFLScaf and SCAFFOLD 2 a
    # device); the count growing round by round through the CLI is tests/algorithms/test_debias.py's (PFLScaf's
    # preset, 2 rounds: 4, 8) and test_cli.py's; the multi-round numbers of each method its golden traces'
    # (test_golden_pfl.py). 2 -> 1 round: 29.8 -> 23.5 CPU-s (back to back, load 3-4)
    text = script("pfl_cifar.py", ["--quick", "--rounds", "1", "--methods", ",".join(methods), "--target", "15",
                                   "--out", str(out)], tmp_path, monkeypatch)
    assert "done in" in text and (out / "summary.md").exists() and (out / "figure2.png").exists()
    for k in methods:
        (ov, m), = job_metrics(out / "runs" / k).items()
        assert dict(ov)["experiment"] == f"cifar10_acid5_{k}"
        assert m["round"].tolist() == [1]
        per_round = (2 if k in ("pflscaf_proto", "pflscaf_maml", "scaffold") else 1) * 3  # 3 devices per round
        assert m["models_transmitted"].tolist() == [per_round]
        assert ("pers_acc" in m) == (k not in ("feddyn", "scaffold"))
    acc = pd.read_csv(out / "accuracy.csv")
    assert set(acc["method"]) == set(methods)


def test_paper_scripts_batch_seeds_by_default_and_match_the_basic_launcher(tmp_path, monkeypatch):
    """--launcher batched (the default) trains each setting's seeds as one computation; the table
    equals --launcher basic's (one job after another). --models picks Table 1's rows."""
    tables = {}
    for launcher in ("batched", "basic"):
        out = tmp_path / launcher
        # pFedMe alone (--algos): its two rows (GM, PM) are a global and a personalized model's; the seeds
        # of every algorithm batched against alone: tests/test_batched.py (12 -> 4 jobs: 12.2 -> 5.0 s of CPU)
        text = script("pfedme_table1.py", ["--quick", "--rounds", "2", "--models", "mlr", "--algos", "pfedme",
                                           "--seeds", "0,1", "--protocols", "official", "--launcher", launcher,
                                           "--out", str(out)], tmp_path, monkeypatch)
        assert f"hydra/launcher={launcher}" in text
        runs = out / "runs" / "synthetic"
        assert len([p for p in runs.iterdir() if (p / "metrics.csv").exists()]) == 2  # 1 preset x 2 seeds
        assert {dict(k)["experiment"] for k in job_metrics(runs)} == {"pfedme_synthetic_mlr_pfedme"}
        tables[launcher] = pd.read_csv(out / "table1.csv")
    assert list(tables["basic"]["entry"]) == ["pFedMe GM", "pFedMe PM"]
    assert (tables["basic"]["official_seeds"] == 2).all()
    assert tables["basic"]["official_best_std"].gt(0).all()  # the two seeds differ
    pd.testing.assert_frame_equal(tables["batched"], tables["basic"], rtol=1e-6)


def test_pfl_cifar_eval_every_and_protocol(tmp_path, monkeypatch):
    out = tmp_path / "every"
    script("pfl_cifar.py", ["--quick", "--methods", "pfldyn_proto", "--eval-every", "2", "--target", "15",
                            "--protocol", "official", "--sampling", "authors", "--out", str(out)], tmp_path,
                            monkeypatch)
    (ov, m), = job_metrics(out / "runs" / "pfldyn_proto").items()
    assert dict(ov)["eval_every"] == "2" and m["round"].tolist() == [2, 3]  # every 2nd round and the last
    (summary,) = (out / "runs" / "pfldyn_proto").glob("*/summary.json")
    summary = json.loads(summary.read_text())
    assert summary["protocol"] == "official"
    assert summary["protocol_choices"]["algo.eval_model"] == "clients_mean"  # the authors' plotted model
    (cfg,) = (out / "runs" / "pfldyn_proto").glob("*/.hydra/config.yaml")
    job_cfg = OmegaConf.load(cfg)
    assert job_cfg.data.pad_fill == "black"  # the default
    assert job_cfg.sampling == "steps"  # --sampling authors: Proto's batches come from a fresh shuffle per step
    saved = json.loads((out / "settings.json").read_text())
    assert (saved["protocol"], saved["pad_fill"], saved["sampling"]) == ("official", "black", "authors")
    assert "protocol=official, data.pad_fill=black, --sampling authors" in (out / "table.md").read_text()
    # --replot draws the runs as they were trained: another split is refused in one line
    with pytest.raises(SystemExit) as e:
        _load_script("pfl_cifar.py")["main"](["--replot", str(out), "--split", "alid"])
    assert e.value.code == 2
    # a folder written before the three options (and --target-lowest): honest, with the old padding,
    # rows drawn with replacement, the lowest device's targets --target's; its settings say ALID
    # (standing in for an ALID run: the drawing only): ALID is the paper's Table 2, Table 4 and Figure 3
    old = {k: v for k, v in saved.items() if k not in ("protocol", "pad_fill", "sampling", "targets_lowest")}
    (out / "settings.json").write_text(json.dumps({**old, "split": "alid"}))
    script("pfl_cifar.py", ["--replot", str(out)], tmp_path, monkeypatch)
    md = (out / "table.md").read_text()
    assert "protocol=honest, data.pad_fill=mean, --sampling replacement" in md and "Table 2 (ALID)" in md
    assert (out / "table_lowest.md").read_text().startswith("# Paper 004 Table 4 (ALID)")
    assert pd.read_csv(out / "table_lowest.csv")["target_pct"].tolist() == [15.0]
    assert (out / "figure3.png").stat().st_size > 10000 and (out / "figure2.png").exists()  # the first run's kept


import baselines  # noqa: E402 - the script's module, for its list of entries

# every entry of the table, 5 at a time (--entries): 5 tests that the test workers share, not one of 25
# runs (67-93 s) that the suite waited for at its end
BASELINE_GROUPS = [list(baselines.ENTRIES)[i:i + 5] for i in range(0, len(baselines.ENTRIES), 5)]


# the PFL baseline table (scripts/baselines.py): every entry, --quick, then --replot. --rounds 1 (--quick's 2 less
# one): each entry's preset runs through the script and its row holds its run's numbers; the last and the best
# round apart (and the lowest decile at the last) are test_baselines_table_keeps_held_out_clients_apart's, on CSVs
# written there (runs of 2 rounds on random data need not make the best round another than the last)
@pytest.mark.parametrize("entries", BASELINE_GROUPS, ids=lambda g: g[0])
def test_baselines_quick_table_figure_and_replot(entries, tmp_path, monkeypatch):
    out = tmp_path / "bl"
    text = script("baselines.py", ["--quick", "--rounds", "1", "--entries", ",".join(entries), "--out", str(out)],
                  tmp_path, monkeypatch)
    table = pd.read_csv(out / "baselines.csv")
    assert list(table["entry"]) == entries and (table["rounds"] == 1).all()
    assert (out / "baselines.png").stat().st_size > 0
    for _, row in table.iterrows():  # the table's numbers are the runs' CSVs
        run = next(p for p in (out / "runs" / baselines._slug(row["entry"])).iterdir() if (p / "metrics.csv").exists())
        m, clients = pd.read_csv(run / "metrics.csv"), pd.read_csv(run / "clients.csv")
        col = f"{row['scored']}_acc"
        assert row["last"] == pytest.approx(100 * m[col].iloc[-1]) and row["best"] == pytest.approx(100 * m[col].max())
        assert row["lowest_decile"] == pytest.approx(100 * clients[col].quantile(0.1))
        assert f"| {row['entry']} | {row['algo']} |" in text
    before = (out / "baselines.md").read_text()
    (out / "baselines.md").unlink()
    script("baselines.py", ["--replot", str(out), "--plot-format", "svg"], tmp_path, monkeypatch)
    assert (out / "baselines.md").read_text() == before
    assert "<svg" in (out / "baselines.svg").read_text()[:1000]  # the figure in the file type asked for


def test_the_split_quick_runs_are_every_entry_and_method_once():
    assert [e for g in BASELINE_GROUPS for e in g] == list(baselines.ENTRIES)
    assert list(PFL_PAPER_METHODS) == _load_script("pfl_cifar.py")["DEFAULT_METHODS"]


def test_baselines_table_keeps_held_out_clients_apart(tmp_path):
    """With a holdout, the lowest decile is over the training clients and the new_* columns over
    the held-out ones (a mixed decile showed Ditto's untrained new clients as its lowest, 6.55)."""
    run = tmp_path / "runs" / baselines._slug("Ditto") / "0_seed=0"
    run.mkdir(parents=True)
    # 3 rounds whose best (the 2nd) is neither the first nor the last
    pd.DataFrame({"round": [1, 2, 3], "pers_acc": [0.5, 0.95, 0.9],
                  "new_pers_acc": [0.2, 0.3, 0.7]}).to_csv(run / "metrics.csv")
    train, new = [0.80 + 0.01 * i for i in range(10)], [0.10, 0.60, 0.70]
    pd.DataFrame({"client": range(13), "heldout": [0] * 10 + [1] * 3,
                  "pers_acc": train + new}).to_csv(run / "clients.csv")
    row, = baselines.table(str(tmp_path))
    assert row["lowest_decile"] == pytest.approx(100 * pd.Series(train).quantile(0.1))
    assert row["new_lowest_decile"] == pytest.approx(100 * pd.Series(new).quantile(0.1))
    assert row["new_last"] == pytest.approx(70.0) and row["rounds"] == 3
    assert row["last"] == pytest.approx(90.0) and row["best"] == pytest.approx(95.0)
    md = (tmp_path / "baselines.md").read_text()
    assert "| new: last round | new: lowest decile |" in md and "| 70.00 | 20.00 |" in md


def test_baselines_takes_another_model_and_partition_with_unseen_clients(data_root, tmp_path, monkeypatch):
    """--data-overrides with model=fedavg_cnn on mnist_dir01 (an MLP setting: its model.hidden=[100] was
    passed on, "model.hidden is not an option of model=fedavg_cnn"), another partition (dirichlet's
    alpha dropped, its client count kept) and held-out clients: each entry's own options stay, the
    setting's options the new choices do not take go."""
    out = tmp_path / "bl"
    root, _ = data_root
    over = "model=fedavg_cnn partition=shards partition.num_clients=6 partition.holdout=2"
    # --rounds 1 (--quick's 2 less one): what is checked is each job's options and the held-out clients' columns
    text = script("baselines.py", ["--setting", "mnist_dir01", "--dataset.root", root, "--no-download", "--quick",
                                   "--rounds", "1", "--entries", "FedAvg,FedPer", "--data-overrides", over, "--out",
                                   str(out)], tmp_path, monkeypatch)
    table = pd.read_csv(out / "baselines.csv")
    assert list(table["entry"]) == ["FedAvg", "FedPer"] and (table["rounds"] == 1).all()
    assert table["new_last"].notna().all() and "new: last round" in text  # the held-out clients' columns
    for entry, algo in (("FedAvg", "fedavg"), ("FedPer", "fedper")):
        (cfg,) = (out / "runs" / baselines._slug(entry)).glob("*/.hydra/config.yaml")
        job = OmegaConf.load(cfg)
        assert job.model._target_ == "fedrun.models.FedAvgCNN" and "hidden" not in job.model
        assert job.data.partition._target_.endswith("Shards") and job.data.partition.num_clients == 6
        assert job.data.partition.holdout == 2 and job.algo.lr == baselines.LR
        assert job.algo._target_.lower().endswith(algo)
        (overrides,) = (out / "runs" / baselines._slug(entry)).glob("*/.hydra/overrides.yaml")
        assert "partition.alpha=0.1" not in OmegaConf.load(overrides)
    # the setting's choices and options as they were, where --data-overrides chooses nothing
    setting = [*baselines.SETTINGS["mnist_dir01"]["data"], "dataset.root=/d", "dataset.download=true"]
    assert baselines.fitted(setting, [], "/d", False) == setting


def test_baselines_bad_setting_or_entry_is_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for argv, named, allowed in ((["--setting", "mnist_dir1"], "--setting 'mnist_dir1'", "mnist_dir01, mnist_shards2"),
                                 (["--entries", "FedAvg,FedNope"], "--entries FedNope", "Local, FedAvg, FedAvg+FT")):
        assert baselines.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and named in err and allowed in err, err
    assert not os.listdir(tmp_path)  # nothing written
    assert {"mnist_dir01", "mnist_shards2", "cifar10_dir01", "cifar10_shards2"} <= set(baselines.SETTINGS)


PLAN_ROW = re.compile(r"^plan (\S+): ([\d.]+) s/round, ([\d.]+) s/evaluation; projected (\d+) rounds x (\d+) seeds x "
                      r"([\d.]+) \+ (\d+) evaluations x (\d+) seeds x ([\d.]+) = ([\d.]+) s", re.M)


def test_baselines_plan_times_every_entry_and_projects_on_tiny_cifar100(tmp_path, monkeypatch, capsys):
    """--plan on generated CIFAR-100 files (the real format): a row per entry, timed or refused in one line,
    each projection = rounds x seeds x s/round + evaluations x seeds x s/evaluation as printed, the total
    their sum; nothing trained, nothing written. Without the files: one line, exit 2."""
    root = _paper.write_tiny_cifar(str(tmp_path / "data"), 100, 2, 1)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDRUN_CACHE", str(tmp_path / "cache"))
    # an entry fedrun refuses: FedRep's head steps fill --quick's tau=2
    monkeypatch.setitem(baselines.ENTRIES, "FedRep-h2", ("fedrep", ["algo.lr=0.05", "algo.head_steps=2"], "pers"))
    argv = ["--setting", "cifar100_dir01_resnet18", "--dataset.root", root, "--no-download", "--quick", "--device",
            "cpu", "--rounds", "3", "--seeds", "0,1", "--eval-every", "2", "--plan-rounds", "1", "--entries",
            "FedAvg,FedRep-h2", "--data-overrides", "partition.num_clients=4 partition.min_size=2 model.width=2"]
    assert baselines.main(argv + ["--plan"]) == 0
    out = capsys.readouterr().out
    rows = {m[0]: m for m in PLAN_ROW.findall(out)}
    assert set(rows) == {"FedAvg"}, out
    refused = re.findall(r"^plan FedRep-h2: refused: (.+)$", out, re.M)
    assert len(refused) == 1 and "head_steps" in refused[0], out
    _, s_round, s_eval, rounds, seeds, s_round2, evals, seeds2, s_eval2, proj = rows["FedAvg"]
    assert (rounds, seeds, seeds2, evals) == ("3", "2", "2", "2")  # evaluated at rounds 2 and 3, 2 seeds
    assert s_round == s_round2 and s_eval == s_eval2 and float(s_round) > 0 and float(s_eval) > 0
    # the printed s/round and s/evaluation are rounded to 4 decimals, the projection to 1
    want = 3 * 2 * float(s_round) + 2 * 2 * float(s_eval)
    assert abs(float(proj) - want) <= (3 * 2 + 2 * 2) * 0.5e-4 + 0.05 + 1e-9, (proj, want)
    total = re.search(r"^plan total: ([\d.]+) s .* projected for 1 entries x 2 seeds on cpu \(CPU.*\), from 1 timed "
                      r"round each; 1 refused", out, re.M)
    assert total and abs(float(total[1]) - float(proj)) <= 0.05 + 1e-9, out
    assert re.search(r"^plan: .* 3 rounds x 2 seeds per entry, evaluated every 2 rounds \(2 evaluations a seed\)",
                     out, re.M), out
    assert not os.path.exists(tmp_path / "outputs")  # --plan trains nothing, writes nothing
    missing = [a if a != root else str(tmp_path / "none") for a in argv]
    with pytest.raises(SystemExit) as stop:
        baselines.main(missing + ["--plan"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and err.startswith("error: --plan: CIFAR-100 not found"), err


def test_baselines_run_without_plan_leaves_refused_entries_out_in_one_line(monkeypatch, capsys):
    """--no-plan: fedrun's checks of each entry's options (no data read); a refused entry is named with its one
    line, the others pass."""
    import argparse

    monkeypatch.setitem(baselines.ENTRIES, "FedRep-h2", ("fedrep", ["algo.lr=0.05", "algo.head_steps=2"], "pers"))
    args = argparse.Namespace(setting="cifar100_dir01_resnet18", data_root="/nowhere", no_download=True, quick=True,
                              data_overrides="", rounds=None, eval_every=None, device="cpu")
    assert list(baselines.refusals(args, ["FedAvg", "FedRep-h2"], [0])) == ["FedRep-h2"]
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("refused FedRep-h2: ") and "head_steps" in out[0], out

# ----------------------------------------------------------------------------------------------
# pFedMe Figures 1-4 (scripts/pfedme_figures.py) and paper 004's toy (scripts/pfl_toy.py)
# ----------------------------------------------------------------------------------------------

def _load_script(name):
    return runpy.run_path(os.path.join(SCRIPTS, name), run_name=name)


def test_pfedme_figures_quick_settings_curves_and_replot(data_root, tmp_path, monkeypatch):
    root, _ = data_root
    out = tmp_path / "figs"
    # Figures 3-4, MLR panels (the test's time: every setting is a job): the comparisons on MNIST and
    # Synthetic; the settings of Figures 1-2 and the DNN are checked without training below
    text = script("pfedme_figures.py", ["--quick", "--figures", "3,4", "--models", "mlr", "--data-root", root,
                                        "--out", str(out)], tmp_path, monkeypatch)
    assert f"outputs: {out}" in text and "settings: 6 runs x 1 seeds, protocol=honest" in text
    mod = _load_script("pfedme_figures.py")
    names = {s.name for s in mod["settings_of"]([3, 4], ["mlr"])}
    assert {p.name for p in (out / "runs").iterdir()} == names and len(names) == 6
    for png in ("figure3.png", "figure4.png"):
        assert (out / png).stat().st_size > 10000
    assert not (out / "figure1.png").exists()
    expect = {  # setting folder -> options its jobs must have run with
        "mnist_mlr_pfedme_K5_beta1_eta0.005_personal_lr0.1_lam15": dict(K=5, beta=1.0, eta=0.005, personal_lr=0.1,
                                                                        lam=15),
        "synthetic_mlr_pfedme_K5_beta1_eta0.005_personal_lr0.01_lam20": dict(lam=20, personal_lr=0.01, eta=0.005),
        "mnist_mlr_perfedavg_alpha0.005_beta0.001": dict(alpha=0.005, beta=0.001, variant="fo"),
        "synthetic_mlr_fedavg_beta0.005": dict(beta=0.005),
    }
    for name, algo in expect.items():
        (cfg_path,) = (out / "runs" / name).glob("*/.hydra/config.yaml")
        cfg = OmegaConf.load(cfg_path)
        for k, v in algo.items():
            assert cfg.algo[k] == pytest.approx(v) if isinstance(v, float) else cfg.algo[k] == v, (name, k)
        data = name.split("_")[0]
        assert (cfg.rounds, cfg.tau, cfg.batch_size, cfg.protocol) == (2, 20, 20, "honest")
        assert cfg.clients_per_round == {"mnist": 5, "synthetic": 10}[data]
        assert cfg.model._target_.endswith("MLR")
    table = pd.read_csv(out / "figures.csv")
    assert len(table) == 4 + 4  # Figures 3-4: pFedMe PM, GM, Per-FedAvg, FedAvg
    for r in table.to_dict("records"):
        (metrics,) = (out / "runs" / r["setting"]).glob("*/metrics.csv")
        m = pd.read_csv(metrics)
        col = "global_acc" if "(GM)" in r["curve"] or r["curve"] == "FedAvg" else "pers_acc"
        assert r["rounds"] == 2 and len(m) == 2
        assert r["acc_last_round_mean"] == pytest.approx(100 * m[col].iloc[-1], abs=1e-6)
        assert r["acc_best_round_mean"] == pytest.approx(100 * m[col].max(), abs=1e-6)
        assert r["acc_last_evals_mean"] == pytest.approx(100 * m[col].mean(), abs=1e-6)  # 2 of the last 10
        assert (r["protocol"], r["fedrun_data"]) == ("honest",
                                                     {"mnist": "mnist_pfedme", "synthetic": "synthetic"}[r["data"]])
    fig4 = table[(table.figure == 4) & (table.model == "mlr")].set_index("curve")["acc_best_round_mean"]
    gap = " / ".join(f"{fig4['pFedMe (PM)'] - fig4[o]:+.1f}" for o in ("pFedMe (GM)", "Per-FedAvg", "FedAvg"))
    assert f"| 4 | MLR | +6.1 / +3.8 / +5.2 | {gap} |" in (out / "figures.md").read_text()
    # --replot draws again from the CSVs, training nothing
    before = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("metrics.csv")}
    (out / "figures.csv").rename(out / "figures.first.csv")
    again = script("pfedme_figures.py", ["--replot", str(out), "--figures", "3,4", "--models", "mlr"], tmp_path,
                   monkeypatch)
    assert "run: fedrun" not in again
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("metrics.csv")} == before
    assert (out / "figures.csv").read_text() == (out / "figures.first.csv").read_text()


def test_pfedme_figures_settings_follow_the_paper():
    """Figure 1 varies K only, Figure 2 beta only (beta=4 with eta=0.003, the authors' README), and a
    setting two figures share is one run folder."""
    mod = _load_script("pfedme_figures.py")
    fig1 = {c.setting for cs in mod["FIGURES"][1][2].values() for c in cs}
    assert sorted(dict(s.options)["K"] for s in fig1 if s.model == "mlr") == [1, 5, 7]
    assert {tuple((k, v) for k, v in s.options if k != "K") for s in fig1} == {
        (("beta", 1.0), ("eta", 0.005), ("personal_lr", 0.09), ("lam", 15))}
    fig2 = {c.setting for cs in mod["FIGURES"][2][2].values() for c in cs}
    assert {(dict(s.options)["beta"], dict(s.options)["eta"]) for s in fig2} == {(1, 0.005), (2, 0.005), (4, 0.003)}
    assert len(mod["settings_of"]([1, 2])) == 6 + 4  # beta=1 of Figure 2 is K=5 of Figure 1
    for data, fig in (("mnist", 3), ("synthetic", 4)):  # the comparisons: the authors' README commands
        opts = {(c.setting.model, c.setting.algo): dict(c.setting.options) for cs in mod["FIGURES"][fig][2].values()
                for c in cs}
        lam, plr = (15, {"mlr": 0.1, "dnn": 0.09}) if data == "mnist" else (20, {"mlr": 0.01, "dnn": 0.01})
        for m in ("mlr", "dnn"):
            assert opts[(m, "pfedme")] == dict(K=5, beta=1.0, eta=0.005, personal_lr=plr[m], lam=lam)
            assert opts[(m, "perfedavg")] == dict(alpha=0.005, beta=0.001) and opts[(m, "fedavg")] == dict(beta=0.005)


@pytest.mark.parametrize("script_name, args, message", [
    ("pfedme_figures.py", ["--figures", "5"], "error: --figures '5' is not allowed; comma-separated, from 1, 2, 3, 4"),
    ("pfedme_figures.py", ["--rounds", "0"], "error: --rounds 0 is not allowed; a positive integer"),
    ("pfedme_figures.py", ["--models", "cnn"], "error: --models 'cnn' is not allowed; comma-separated, from mlr, dnn"),
    ("pfl_toy.py", ["--methods", "fedprox"],
     "error: --methods fedprox is not allowed; choose from perfedavg, pfldyn, pflscaf"),
    ("pfl_toy.py", ["--lr", "-1"], "error: --lr -1.0 is not allowed; a positive number"),
    ("pfl_cifar.py", ["--methods", "nope"], "error: --methods 'nope': unknown; choose from " + ", ".join(
        ["perfedavg_maml", "pfldyn_proto", "pfldyn_maml", "pflscaf_proto", "pflscaf_maml", "pavg_proto", "feddyn",
         "scaffold", "fedavg", "fedavg_update", "perfedavg_fo"])),
    ("pfl_cifar.py", ["--quick", "--target", "abc"], "error: --target 'abc' is not a number"),
    ("pfl_cifar.py", ["--quick", "--baseline", "nope"], "error: --baseline 'nope': unknown; choose from " + ", ".join(
        ["perfedavg_maml", "pfldyn_proto", "pfldyn_maml", "pflscaf_proto", "pflscaf_maml", "pavg_proto", "feddyn",
         "scaffold", "fedavg", "fedavg_update", "perfedavg_fo"])),
    ("pfedme_table1.py", ["--models", "cnn"], "error: --models cnn is not allowed; choose from mlr, dnn"),
    ("pfedme_table1.py", ["--seeds", "a"], "error: --seeds 'a' must be comma-separated integers"),
    ("perfedavg_figure1.py", ["--pairs", "x"], "error: --pairs item 'x' must be tau:r, e.g. 10:0.2"),
])
def test_figure_scripts_bad_input_is_one_line_exit_2(script_name, args, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        _load_script(script_name)["main"](args + ["--out", str(tmp_path / "o")])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == message
    assert not (tmp_path / "o").exists() and not (tmp_path / "outputs").exists()


def test_pfl_toy_quick_paths_are_fedruns_updates(tmp_path, monkeypatch):
    import torch

    out = tmp_path / "toy"
    text = script("pfl_toy.py", ["--quick", "--tau", "1", "--out", str(out)], tmp_path, monkeypatch)
    assert f"outputs: {out}" in text and (out / "toy.png").stat().st_size > 10000
    mod = _load_script("pfl_toy.py")
    paths = pd.read_csv(out / "paths.csv")
    assert sorted(set(paths["method"])) == ["perfedavg", "pfldyn", "pflscaf"]
    # Per-FedAvg (PAvg, MAML), one local step, one active device: round 1's server model is START
    # minus lr times the gradient of that device's f_i o T_i, computed here by autograd (4 params)
    data = mod["toy_data"]()
    p0 = {k: v.clone().requires_grad_(True) for k, v in mod["to_params"](mod["START"]).items()}
    from fedrun.engine import ENGINES
    from fedrun.models import MLR

    engine = ENGINES["vmap"](MLR(1, 2))
    steps = []
    for c in range(3):
        rows = data.train.client_rows(c)
        x, y = data.train.x[rows], data.train.y[rows]
        g = torch.autograd.grad(engine.loss(p0, x, y), list(p0.values()), create_graph=True)
        meta = engine.loss({k: p0[k] - mod["INNER_LR"] * gk for k, gk in zip(p0, g)}, x, y)
        gm = torch.autograd.grad(meta, list(p0.values()))
        steps.append(mod["to_plane"]({k: (p0[k] - 0.3 * gk).detach() for k, gk in zip(p0, gm)}))
    first = paths[(paths.method == "perfedavg") & (paths["round"] == 1)][["slope", "intercept"]].to_numpy()[0]
    assert min(np.abs(first - s).max() for s in steps) < 1e-5
    assert max(np.abs(first - s).max() for s in steps) > 1e-2  # the devices' steps differ: the check can tell
    start = paths[paths["round"] == 0][["slope", "intercept"]].to_numpy()
    assert np.allclose(start, mod["START"])
    assert (paths.groupby("method")["round"].max() == 4).all()
    md = (out / "toy.md").read_text()
    assert "| minimum of F |" in md and "| PFLScaf (MAML) |" in md

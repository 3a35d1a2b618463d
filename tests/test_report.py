"""Sweeps and reports: a tiny real multirun (2 algorithms x 2 seeds), its job folders, and the report's
numbers checked against the jobs' own CSVs, computed here independently with pandas; jobs that did
not finish are listed and left out; the launcher configs compose, and the joblib launcher runs the
sweep in parallel worker processes. fedrun and fedrun-report run in this process (helpers.fedrun,
fedrun.report.main)."""
import contextlib
import io
import json
import math
import shutil

import pandas as pd
import pytest
import yaml
from helpers import Result, fedrun
from hydra import compose, initialize_config_dir

from fedrun.config import CONF_DIR
from fedrun.report import Job, missing_job_numbers, parse_targets
from fedrun.report import main as report_main
from fedrun.report.markdown import MD_COLUMNS
from fedrun.run.checks import precheck

# data.seed=9: 2,435 synthetic rows for 6 clients (the default seed 0 draws 48,930)
SWEEP = ["-m", "algo=fedavg,perfedavg", "seed=0,1", "data.num_clients=6", "data.seed=9", "rounds=2", "tau=2",
         "clients_per_round=3", "progress=false", "plot=false"]
STATS = ("acc_last_round", "acc_best_round", "acc_client_min_last_round", "acc_client_max_last_round")


def report(args, cwd):
    """`fedrun-report *args` (absolute paths): its exit status and what it prints."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = report_main([str(a) for a in args])
    return Result(code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    r = fedrun([*SWEEP, f"hydra.sweep.dir={tmp / 'sweep'}"], tmp)
    assert r.returncode == 0, r.stderr
    return tmp / "sweep", r


@pytest.fixture(scope="module")
def sweep(sweep_run):
    return sweep_run[0]


def test_a_multirun_ends_with_its_summary_table(sweep_run):
    sweep, r = sweep_run
    assert "fedrun: sweep summary (4 jobs, 4 finished, 2 configurations" in r.stdout
    for f in ("summary.csv", "summary.md", "jobs.csv"):
        assert (sweep / f).exists(), f
    assert not (sweep / "summary.png").exists()  # the sweep ran with plot=false
    jobs = jobs_of(sweep)
    printed = [l for l in r.stdout.splitlines() if l.startswith("| algo=")]
    assert len(printed) == 2
    for algo, line in zip(("fedavg", "perfedavg"), printed):
        assert line.startswith(f"| algo={algo}")
        want = expected([jobs[(algo, 0)], jobs[(algo, 1)]], [])
        for p in ("global", "pers"):
            m, s = want[f"{p}_acc_last_round_mean"], want[f"{p}_acc_last_round_std"]
            assert f"{m * 100:.2f} ± {s * 100:.2f}" in line, (p, line)


def jobs_of(sweep_dir):
    """{(algo, seed): metrics DataFrame} read straight from the job folders."""
    out = {}
    for d in sorted(p for p in sweep_dir.iterdir() if (p / ".hydra").is_dir()):
        ov = dict(o.split("=", 1) for o in yaml.safe_load((d / ".hydra" / "overrides.yaml").read_text()))
        out[(ov["algo"], int(ov["seed"]))] = pd.read_csv(d / "metrics.csv")
    return out


def expected(frames, target_list):
    """What summary.csv must say for one configuration, from its jobs' metrics.csv."""
    want = {}
    for p in ("global", "pers"):
        per_job = {
            "acc_last_round": [m[f"{p}_acc"].iloc[-1] for m in frames],
            "acc_best_round": [m[f"{p}_acc"].max() for m in frames],
            "acc_client_min_last_round": [m[f"{p}_acc_min"].iloc[-1] for m in frames],
            "acc_client_max_last_round": [m[f"{p}_acc_max"].iloc[-1] for m in frames],
        }
        for t in target_list:
            hits = [m.loc[m[f"{p}_acc"] >= t, "round"] for m in frames]
            per_job[f"rounds_to_{t * 100:g}pct"] = [h.iloc[0] if len(h) else math.nan for h in hits]
        for name, vals in per_job.items():
            s = pd.Series(vals, dtype=float)
            if name.startswith("rounds_to") and s.isna().any():
                want[f"{p}_{name}_mean"], want[f"{p}_{name}_std"] = math.nan, math.nan
                want[f"{p}_{name}_reached"] = f"{int(s.notna().sum())}/{len(s)}"
                continue
            want[f"{p}_{name}_mean"] = s.mean()
            want[f"{p}_{name}_std"] = s.std() if len(s) > 1 else math.nan
    return want


def check_row(row, want):
    for k, v in want.items():
        if k.endswith("_reached"):
            assert row[k] == v, k
        elif math.isnan(v):
            assert pd.isna(row[k]), k
        else:
            assert row[k] == pytest.approx(v, abs=1e-9), k


def test_multirun_job_folders_are_named_by_their_overrides_without_the_seed(sweep):
    names = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert len(names) == 4, names
    for n in names:
        options = n.split("_", 1)[1].split(",")
        assert not any(o.startswith(("seed=", "progress=", "plot=")) for o in options), n
        assert "data.num_clients=6" in n and "rounds=2" in n
    # the two seeds of one algorithm differ only by the job number in front
    rest = sorted(n.split("_", 1)[1] for n in names)
    assert rest[0] == rest[1] and rest[2] == rest[3] and rest[0] != rest[2]
    assert {r.split(",")[0] for r in rest} == {"algo=fedavg", "algo=perfedavg"}


def test_report_numbers_equal_the_mean_and_std_of_the_jobs_csvs(sweep, tmp_path):
    jobs = jobs_of(sweep)
    assert set(jobs) == {(a, s) for a in ("fedavg", "perfedavg") for s in (0, 1)}
    # one target every job reaches at round 1, one in the middle of the round-1 accuracies, one none reaches
    first = sorted(m["pers_acc"].iloc[0] for m in jobs.values())
    targets = [0.01, round((first[1] + first[2]) / 2, 4), 0.9999]
    out = tmp_path / "rep"
    r = report([str(sweep), "--target", ",".join(map(str, targets)), "--out", str(out)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "4 jobs, 4 finished, 2 configurations" in r.stdout
    for f in ("summary.csv", "summary.md", "summary.png", "jobs.csv"):
        assert (out / f).exists(), f
    assert (out / "summary.png").stat().st_size > 5000
    table = pd.read_csv(out / "summary.csv")
    assert list(table["config"]) == ["algo=fedavg", "algo=perfedavg"]
    md = (out / "summary.md").read_text()
    for algo in ("fedavg", "perfedavg"):
        row = table.set_index("config").loc[f"algo={algo}"]
        assert row["n_seeds"] == 2 and str(row["seeds"]) == "0 1"
        want = expected([jobs[(algo, 0)], jobs[(algo, 1)]], targets)
        check_row(row, want)
        line = next(l for l in md.splitlines() if l.startswith(f"| algo={algo} |"))
        for p in ("global", "pers"):
            for stat in MD_COLUMNS:  # summary.md shows these; summary.csv (checked above) has all of STATS
                m, s = want[f"{p}_{stat}_mean"], want[f"{p}_{stat}_std"]
                assert f"{m * 100:.2f} ± {s * 100:.2f}" in line, (p, stat, line)
    assert "rounds to 1%" in md and "All jobs finished" in md
    status = pd.read_csv(out / "jobs.csv")
    assert (status["status"] == "ok").all() and len(status) == 4


def test_unfinished_jobs_are_listed_and_left_out(sweep, tmp_path):
    copy = tmp_path / "sweep"
    shutil.copytree(sweep, copy)
    dirs = {}
    for d in copy.iterdir():
        if (d / ".hydra").is_dir():
            ov = dict(o.split("=", 1) for o in yaml.safe_load((d / ".hydra" / "overrides.yaml").read_text()))
            dirs[(ov["algo"], int(ov["seed"]))] = d
    (dirs[("fedavg", 1)] / "summary.json").unlink()                      # failed or killed
    m = pd.read_csv(dirs[("perfedavg", 0)] / "metrics.csv")                # fewer rows than rounds promise
    m.iloc[:1].to_csv(dirs[("perfedavg", 0)] / "metrics.csv", index=False)
    r = report([str(copy)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "4 jobs, 2 finished, 2 configurations" in r.stdout
    assert r.stdout.count("left out") == 2
    table = pd.read_csv(copy / "summary.csv").set_index("config")
    jobs = jobs_of(copy)
    for algo, seed in (("fedavg", 0), ("perfedavg", 1)):
        row = table.loc[f"algo={algo}"]
        assert row["n_seeds"] == 1 and str(row["seeds"]) == str(seed)
        check_row(row, expected([jobs[(algo, seed)]], []))
    md = (copy / "summary.md").read_text()
    left = md.split("## Jobs left out")[1]
    assert "algo=fedavg, seed 1: no summary.json" in left
    assert "algo=perfedavg, seed 0: incomplete: metrics.csv has 1 of 2 rows" in left
    status = pd.read_csv(copy / "jobs.csv")
    assert sorted(status["status"] == "ok") == [False, False, True, True]


def test_a_seed_found_twice_counts_once(tmp_path):
    """Two sweeps over the same runs (or `seed=0,0` before fedrun refused it): the seed's second job is
    left out with where its first is, not counted as one more seed (n 2, std 0)."""
    root = tmp_path / "twice"
    pers = [0.4, 0.5, 0.6, 0.7]
    _write_job(root / "a" / "0_algo=fedavg", 0, "fedavg", 0, 10, pers, pers)
    _write_job(root / "b" / "0_algo=fedavg", 0, "fedavg", 0, 10, pers, pers)
    _write_job(root / "b" / "1_algo=fedavg", 1, "fedavg", 1, 10, [0.5, 0.6, 0.7, 0.8], pers)
    r = report([str(root), "--no-figure"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "3 jobs, 2 finished, 1 configurations" in r.stdout
    first, second = root / "a" / "0_algo=fedavg", root / "b" / "0_algo=fedavg"
    assert f"left out {second}: the same configuration and seed as {first}: counted once" in r.stdout
    row = pd.read_csv(root / "summary.csv").iloc[0]
    assert row["n_seeds"] == 2 and str(row["seeds"]) == "0 1"
    assert row["pers_acc_last_round_mean"] == pytest.approx(0.75)


def test_missing_job_numbers_are_reported():
    jobs = [Job(path=f"/s/{n}_x", num=n) for n in (0, 1, 3, 5)]
    (msg,) = missing_job_numbers(jobs)
    assert msg.startswith("/s:") and "job number(s) 2, 4" in msg


def test_targets_accept_fractions_and_percents():
    assert parse_targets(["0.8", "85,90%"]) == [0.8, 0.85, 0.9]
    with pytest.raises(ValueError):
        parse_targets(["150"])


def _launcher(name, *extra):
    """The composed hydra.launcher node (the plugins are in the test extra: a missing one fails here)."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=[f"hydra/launcher={name}", *extra], return_hydra_config=True).hydra.launcher


def test_local_parallel_launcher_config_composes():
    cfg = _launcher("parallel", "hydra.launcher.n_jobs=3")
    assert cfg._target_.endswith("JoblibLauncher") and cfg.n_jobs == 3


def test_parallel_sweep_gives_the_numbers_of_the_sequential_one(sweep, tmp_path):
    args = [a for a in SWEEP if not a.startswith("seed=")] + ["seed=0", "hydra/launcher=parallel",
                                                              "hydra.launcher.n_jobs=2",
                                                              "~hydra.callbacks.sweep_report"]
    r = fedrun([*args, f"hydra.sweep.dir={tmp_path / 'par'}"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Joblib.Parallel(n_jobs=2" in r.stdout + r.stderr
    # threads=auto: one per job (joblib itself leaves a worker cores / n_jobs: on a 2-core machine this
    # holds either way; tests/test_device.py checks the option picks 1 for this launcher)
    threads = [json.loads((d / "summary.json").read_text())["threads"] for d in (tmp_path / "par").glob("*_algo=*")]
    assert threads == [1, 1]
    par, seq = jobs_of(tmp_path / "par"), jobs_of(sweep)
    assert set(par) == {("fedavg", 0), ("perfedavg", 0)}
    assert not (tmp_path / "par" / "summary.md").exists() and "sweep summary" not in r.stdout  # callback off
    for k, m in par.items():
        pd.testing.assert_frame_equal(m, seq[k])


def test_slurm_launcher_config_composes():
    cfg = _launcher("slurm", "hydra.launcher.partition=gpu", "hydra.launcher.timeout_min=120")
    assert cfg._target_.endswith("SlurmLauncher")
    assert cfg.partition == "gpu" and cfg.timeout_min == 120 and cfg.gpus_per_node == 1
    assert cfg.submitit_folder.endswith("/.submitit/%j")


def test_cli_precheck_lets_launcher_choices_through():
    assert precheck(["-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2", "seed=0,1"]) is None


# ----------------------------------------------------------------------------------------------
# models transmitted to reach a target, gain vs a baseline, lowest/highest client at the best round:
# hand-written metrics.csv files, the expected numbers computed here directly with pandas
# ----------------------------------------------------------------------------------------------

def _write_job(folder, num, algo, seed, per_round, pers, glob, extra=None):
    """A finished job folder as fedrun + Hydra write it: 4 rounds, `per_round` models sent per round."""
    folder.mkdir(parents=True)
    (folder / ".hydra").mkdir()
    cfg = {"seed": seed, "rounds": len(pers), "eval_every": 1, "algo": {"_target_": f"x.{algo}", **(extra or {})}}
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    (folder / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(
        {"hydra": {"runtime": {"choices": {"algo": algo}}, "job": {"num": num}}}))
    rounds = list(range(1, len(pers) + 1))
    m = pd.DataFrame({"round": rounds, "models_transmitted": [per_round * r for r in rounds], "train_loss": 1.0})
    for p, accs in (("pers", pers), ("global", glob)):
        m[f"{p}_acc"] = accs
        m[f"{p}_acc_min"] = [a - 0.1 - 0.01 * r for a, r in zip(accs, rounds)]
        m[f"{p}_acc_max"] = [min(1.0, a + 0.05 + 0.01 * r) for a, r in zip(accs, rounds)]
    m.to_csv(folder / "metrics.csv", index=False)
    (folder / "summary.json").write_text('{"status": "finished", "seconds": 1.0}')


HAND = {  # (algo, seed): (models per round, pers_acc by round, global_acc by round)
    ("perfedavg", 0): (10, [0.40, 0.55, 0.61, 0.60], [0.3, 0.3, 0.3, 0.3]),
    ("perfedavg", 1): (10, [0.50, 0.58, 0.58, 0.70], [0.3, 0.3, 0.3, 0.3]),
    ("pflscaf", 0): (20, [0.62, 0.70, 0.70, 0.66], [0.2, 0.4, 0.5, 0.5]),     # best round tied: the first counts
    ("pflscaf", 1): (20, [0.55, 0.60, 0.72, 0.71], [0.2, 0.4, 0.5, 0.5]),
    ("pfldyn", 0): (10, [0.59, 0.60, 0.65, 0.64], [0.1, 0.1, 0.1, 0.1]),       # 0.60 equals the target: reached
    ("pfldyn", 1): (10, [0.50, 0.52, 0.55, 0.56], [0.1, 0.1, 0.1, 0.1]),       # never reaches 0.6
}


@pytest.fixture
def hand_sweep(tmp_path):
    root = tmp_path / "hand"
    for n, ((algo, seed), (per_round, pers, glob)) in enumerate(HAND.items()):
        _write_job(root / f"{n}_algo={algo}", n, algo, seed, per_round, pers, glob)
    return root


def _direct(root, algo, col, target):
    """Per seed, straight from the metrics.csv files: transmitted at the first row reaching the target
    (NaN if none), the last row's transmitted, and the lowest/highest client at the best row."""
    out = []
    for (a, _seed), _ in HAND.items():
        if a != algo:
            continue
        d = next(p for p in root.iterdir() if p.name.endswith(f"algo={algo}") and
                 yaml.safe_load((p / ".hydra" / "config.yaml").read_text())["seed"] == _seed)
        m = pd.read_csv(d / "metrics.csv")
        reached = m[m[col] >= target]
        best = m[m[col] == m[col].max()].iloc[0]
        out.append({"sent": reached["models_transmitted"].iloc[0] if len(reached) else math.nan,
                    "last": m["models_transmitted"].iloc[-1], "min_best": best[f"{col}_min"],
                    "max_best": best[f"{col}_max"], "best_round": best["round"]})
    return pd.DataFrame(out)


def test_transmissions_to_target_gain_and_best_round_clients(hand_sweep, tmp_path):
    out = tmp_path / "rep"
    r = report([str(hand_sweep), "--target", "60", "--baseline", "perfedavg", "--out", str(out), "--no-figure"],
               tmp_path)
    assert r.returncode == 0, r.stderr
    table = pd.read_csv(out / "summary.csv", keep_default_na=False, na_values=[""]).set_index("config")
    assert sorted(table.index) == ["algo=perfedavg", "algo=pfldyn", "algo=pflscaf"]
    d = {a: _direct(hand_sweep, a, "pers_acc", 0.6) for a in ("perfedavg", "pflscaf", "pfldyn")}
    # every seed reached it: mean and sample std of the transmitted counts
    for a in ("perfedavg", "pflscaf"):
        row = table.loc[f"algo={a}"]
        assert row["pers_transmitted_to_60pct_reached"] == "2/2"
        assert row["pers_transmitted_to_60pct_mean"] == pytest.approx(d[a]["sent"].mean())
        assert row["pers_transmitted_to_60pct_std"] == pytest.approx(d[a]["sent"].std(ddof=1))
        assert row["pers_transmitted_to_60pct_at_least"] == pytest.approx(d[a]["sent"].mean())
    assert table.loc["algo=perfedavg", "pers_transmitted_to_60pct_mean"] == 35      # rounds 3 and 4, 10 per round
    assert table.loc["algo=pflscaf", "pers_transmitted_to_60pct_mean"] == 30        # rounds 1 and 2, 20 per round
    # one seed never got there: no mean, the count says so, and at_least counts all it sent
    dyn = table.loc["algo=pfldyn"]
    assert dyn["pers_transmitted_to_60pct_reached"] == "1/2" and pd.isna(dyn["pers_transmitted_to_60pct_mean"])
    assert dyn["pers_transmitted_to_60pct_at_least"] == pytest.approx(
        d["pfldyn"]["sent"].fillna(d["pfldyn"]["last"]).mean())
    assert dyn["pers_transmitted_to_60pct_at_least"] == 30                          # (20 + 40) / 2
    # gain = baseline's transmissions / the configuration's; an upper bound when only the baseline got there
    base = d["perfedavg"]["sent"].mean()
    assert table.loc["algo=perfedavg", "pers_gain_to_60pct"] == pytest.approx(1.0)
    assert table.loc["algo=pflscaf", "pers_gain_to_60pct"] == pytest.approx(base / d["pflscaf"]["sent"].mean())
    assert pd.isna(table.loc["algo=pflscaf", "pers_gain_to_60pct_bound"])
    assert table.loc["algo=pfldyn", "pers_gain_to_60pct"] == pytest.approx(base / 30)
    assert table.loc["algo=pfldyn", "pers_gain_to_60pct_bound"] == "<"
    # nobody reaches 0.6 with the global model: no gain at all
    assert table["global_transmitted_to_60pct_reached"].tolist() == ["0/2"] * 3
    assert table["global_gain_to_60pct"].isna().all()
    # lowest / highest client at the best round (first of tied best rows) and at the last round
    for a in d:
        row = table.loc[f"algo={a}"]
        assert row["pers_acc_client_min_best_round_mean"] == pytest.approx(d[a]["min_best"].mean())
        assert row["pers_acc_client_max_best_round_mean"] == pytest.approx(d[a]["max_best"].mean())
        assert row["pers_acc_client_min_best_round_std"] == pytest.approx(d[a]["min_best"].std(ddof=1))
        assert row["pers_best_round_mean"] == pytest.approx(d[a]["best_round"].mean())
    assert d["pflscaf"]["best_round"].tolist() == [2, 3]
    md = (out / "summary.md").read_text()
    line = next(l for l in md.splitlines() if l.startswith("| algo=pfldyn |"))
    assert "reached by 1/2 seeds only (> 30 sent)" in line and "<1.17×" in line
    line = next(l for l in md.splitlines() if l.startswith("| algo=pflscaf |"))
    assert "30.0 ± 14.1" in line and "| 1.17× |" in line
    assert "gain at 60%" in md and "algo=perfedavg's transmissions" in md


def test_gain_lower_bound_when_the_baseline_never_gets_there(hand_sweep, tmp_path):
    r = report([str(hand_sweep), "--target", "0.7", "--baseline", "algo=pfldyn", "--out", str(tmp_path / "r"),
                "--no-figure"], tmp_path)
    assert r.returncode == 0, r.stderr
    table = pd.read_csv(tmp_path / "r" / "summary.csv", keep_default_na=False, na_values=[""]).set_index("config")
    # pflscaf: both seeds reach 0.7 (rounds 2 and 3: 40 and 60); pfldyn never does (sent 40 and 40)
    assert table.loc["algo=pflscaf", "pers_transmitted_to_70pct_mean"] == 50
    assert table.loc["algo=pflscaf", "pers_gain_to_70pct"] == pytest.approx(40 / 50)
    assert table.loc["algo=pflscaf", "pers_gain_to_70pct_bound"] == ">"
    # perfedavg: one seed only -> neither reached by all seeds: no gain
    assert pd.isna(table.loc["algo=perfedavg", "pers_gain_to_70pct"])


def test_baseline_errors_are_one_line(hand_sweep, tmp_path):
    for args, msg in ((["--target", "60", "--baseline", "nope"], "names no configuration"),
                      (["--baseline", "perfedavg"], "needs at least one --target")):
        r = report([str(hand_sweep), *args, "--out", str(tmp_path / "e"), "--no-figure"], tmp_path)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_find_baseline_by_label_preset_or_algo():
    from fedrun.report import Group, find_baseline

    def grp(label, **settings):
        return Group(label=label, settings={}, jobs=[Job(path=label, settings=settings)])

    groups = [grp("experiment=cifar10_acid5_perfedavg_maml", experiment="cifar10_acid5_perfedavg_maml",
                  algo="perfedavg"),
              grp("experiment=cifar10_acid5_pfldyn_proto", experiment="cifar10_acid5_pfldyn_proto", algo="pfldyn"),
              grp("experiment=cifar10_acid5_pfldyn_maml", experiment="cifar10_acid5_pfldyn_maml", algo="pfldyn")]
    assert find_baseline(groups, "cifar10_acid5_perfedavg_maml") is groups[0]
    assert find_baseline(groups, "perfedavg") is groups[0]
    assert find_baseline(groups, "experiment=cifar10_acid5_pfldyn_maml") is groups[2]
    with pytest.raises(ValueError, match="matches 2 configurations"):
        find_baseline(groups, "pfldyn")


def test_not_reached_cell_is_empty_for_a_model_the_configuration_lacks():
    from fedrun.report import _not_reached

    assert _not_reached(float("nan")) == ""
    assert _not_reached("0/2") == "not reached"


def test_an_option_left_null_groups_with_jobs_from_before_it_existed(tmp_path):
    root = tmp_path / "mixed"
    _write_job(root / "0_a", 0, "perfedavg", 0, 10, [0.4, 0.5, 0.6, 0.7], [0.3] * 4)
    _write_job(root / "1_a", 1, "perfedavg", 1, 10, [0.5, 0.5, 0.6, 0.6], [0.3] * 4, {"new_option": None})
    _write_job(root / "2_a", 2, "perfedavg", 2, 10, [0.5, 0.5, 0.6, 0.6], [0.3] * 4, {"new_option": "on"})
    r = report([str(root), "--no-figure"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "3 jobs, 3 finished, 2 configurations" in r.stdout


def test_a_job_from_before_an_option_groups_with_the_value_it_computed(tmp_path):
    """CIFAR jobs from before data.pad_fill padded with the mean colour: they group with pad_fill=mean
    jobs, not with the new default (black)."""
    root = tmp_path / "pad"
    for num, fill in enumerate([None, "mean", "black"]):
        folder = root / f"{num}_x"
        _write_job(folder, num, "pfldyn", num, 10, [0.4, 0.5, 0.6, 0.7], [0.3] * 4)
        cfg = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
        cfg["data"] = {"_target_": "fedrun.data.cifar", "classes_per_client": 5, **({"pad_fill": fill} if fill else {})}
        (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
        (folder / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(
            {"hydra": {"runtime": {"choices": {"algo": "pfldyn", "data": "cifar10_acid"}}, "job": {"num": num}}}))
    r = report([str(root), "--no-figure"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "3 jobs, 3 finished, 2 configurations" in r.stdout
    table = (root / "summary.csv").read_text()
    assert "mean" in table and "black" in table


def test_read_yaml_reads_as_omegaconf_does(tmp_path):
    """fedrun.config.read_yaml (libyaml with OmegaConf's rules; the report reads every job's .hydra
    files with it) gives what OmegaConf.load + to_container(resolve=False) gives: every shipped
    config, Hydra's own (which it composes into every job), and OmegaConf's own cases (1e-3 is a
    float, a date stays a string, interpolations stay strings)."""
    import glob
    import os

    import hydra
    from omegaconf import OmegaConf

    from fedrun.config import CONF_DIR, read_yaml

    odd = tmp_path / "odd.yaml"
    odd.write_text("a: 1e-3\nb: 2020-01-01\nc: ${a}\nd: .5\ne: [1, '2', null, true]\nf: {g: -.inf}\nh: 1_000\n")
    hydras = glob.glob(os.path.join(os.path.dirname(hydra.__file__), "conf", "**", "*.yaml"), recursive=True)
    assert len(hydras) > 10
    files = [*glob.glob(os.path.join(CONF_DIR, "**", "*.yaml"), recursive=True), *hydras, str(odd)]
    for path in files:
        want = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        assert read_yaml(path) == want and repr(read_yaml(path)) == repr(want), path
    (tmp_path / "dup.yaml").write_text("a: 1\na: 2\n")
    with pytest.raises(Exception, match="duplicate key a"):
        read_yaml(str(tmp_path / "dup.yaml"))


# ----------------------------------------------------------------------------------------------
# the sweep's figure: fitted axes, short legends, no empty panel, 20+ lines apart, png | pdf | svg
# ----------------------------------------------------------------------------------------------

@pytest.fixture
def wide_sweep(tmp_path):
    """22 configurations (algo.lr x algo.K) x 2 seeds at 90-97% after a climb from 10%."""
    root = tmp_path / "wide"
    n = 0
    for lr in (0.01, 0.02):
        for k in range(11):
            for seed in (0, 1):
                top = 0.90 + 0.04 * (lr == 0.02) + 0.003 * k + 0.001 * seed
                pers = [0.1, 0.5] + [top - 0.01, top] * 4  # 10 rounds: the y-axis leaves out the first two
                _write_job(root / f"{n}_algo.lr={lr},algo.K={k}", n, "pfedme", seed, 10, pers, [0.5] * 10,
                           extra={"lr": lr, "K": k})
                n += 1
    return root


def _captured_figure(monkeypatch, root):
    """write_report's summary figure, kept open (save_figure closes it) for its axes to be read."""
    import fedrun.plots

    seen = []
    real = fedrun.plots.save_figure
    monkeypatch.setattr(fedrun.plots, "save_figure", lambda fig, path,
                        title="": (seen.append(fig), real(fig, path, title)))
    from fedrun.report import write_report

    write_report([str(root)])
    fig, = seen
    return fig


def test_summary_figure_fits_its_axes_labels_lines_by_the_swept_values_and_keeps_22_apart(wide_sweep, monkeypatch):
    fig = _captured_figure(monkeypatch, wide_sweep)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["global model accuracy", "personalized accuracy"]
    pers = panels[1]
    low, high = pers.get_ylim()
    assert 0.88 < low < 0.89 and 0.971 < high < 0.98, (low, high)  # 0.89 (the lowest after the climb) to 0.971, padded
    legend, = fig.legends
    assert legend.get_title().get_text() == "pfedme: algo.K, algo.lr"  # one method's options: its name heads them
    assert [t.get_text() for t in legend.get_texts()][:3] == ["0, 0.01", "0, 0.02", "1, 0.01"]
    styles = {(line.get_color(), line.get_marker(), line.get_linestyle()) for line in pers.get_lines()}
    assert len(pers.get_lines()) == 22 and len({(c, m) for c, m, _ in styles}) == 22


def test_summary_figure_names_methods_holds_its_bands_and_shows_a_method_evaluated_once(tmp_path, monkeypatch):
    """Three methods, each with its own defaults (algo.lr, algo.finetune_steps differ between them:
    no difference the sweep made): the legend is the methods' names and the one option the sweep
    varied (eval_every), not `algo=fedproto, algo.finetune_steps=0, ...`; each panel's y-axis holds
    every mean +- std after the climb (a band was cut off at the top); the method evaluated once is a
    marker with its +- std bar, and the legend says it was evaluated once."""
    import numpy as np
    from matplotlib.container import ErrorbarContainer

    root = tmp_path / "s"
    pers = {0: [0.5, 0.6, 0.7, 0.80], 1: [0.5, 0.6, 0.7, 0.98]}  # last round: 0.89 +- 0.127, past 1.0
    n = 0
    for algo, extra in (("fedavg", {"lr": 0.02, "finetune_steps": 1}), ("fedproto", {"lr": 0.01, "finetune_steps": 0}),
                        ("fedrep", {"lr": 0.02, "finetune_steps": 0})):
        for seed in (0, 1):
            _write_job(root / f"{n}_algo={algo}", n, algo, seed, 10, pers[seed], [0.3] * 4, extra=extra)
            n += 1
    for seed, last in ((0, 0.70), (1, 0.76)):  # evaluated after its last round only (eval_every=10 > rounds)
        folder = root / f"{n}_once"
        _write_job(folder, n, "fedbabu", seed, 10, [0.5, 0.6, 0.7, last], [0.3] * 4,
                   extra={"lr": 0.02, "finetune_steps": 5})
        cfg = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
        (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump({**cfg, "eval_every": 10}))
        m = pd.read_csv(folder / "metrics.csv")
        m.iloc[[-1]].to_csv(folder / "metrics.csv", index=False)
        n += 1
    fig = _captured_figure(monkeypatch, root)
    legend, = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [
        "fedavg, eval_every=1", "fedbabu, eval_every=10 (evaluated once)", "fedproto, eval_every=1",
        "fedrep, eval_every=1"]
    assert legend.get_title().get_text() == ""
    pers_ax = [ax for ax in fig.axes if ax.get_visible() and ax.get_title() == "personalized accuracy"][0]
    low, high = pers_ax.get_ylim()
    s = pd.DataFrame(pers)
    mean, std = s.mean(axis=1), s.std(axis=1)
    assert high >= (mean + std).max() and low <= (mean - std).iloc[int(len(s) * 0.2):].min(), (low, high)
    once, = [c for c in pers_ax.containers if isinstance(c, ErrorbarContainer)]
    point, _, (bar,) = once
    assert once.get_label() == "fedbabu, eval_every=10 (evaluated once)"
    assert point.get_markersize() >= 6 and point.get_xdata().tolist() == [4]
    segment = bar.get_segments()[0]  # the +- std bar: 0.73 +- the two seeds' std
    assert np.allclose(segment[:, 1], [0.73 - np.std([0.70, 0.76], ddof=1), 0.73 + np.std([0.70, 0.76], ddof=1)])


def test_legend_of_one_method_s_options_across_methods_names_the_method_and_what_differs():
    """fedprox at two mu beside fedavg: `fedprox, mu=0.01`, `fedprox, mu=0.1`, `fedavg` (algo.lr, each
    method's default, differs too, and is left out); a partition's option differs: shown whole."""
    from fedrun.report.figure import short_labels
    from fedrun.report.jobs import Group

    def group(label, settings, varying):
        return Group(label=label, settings={k: settings[k] for k in varying if k in settings},
                     jobs=[Job(path=label, settings=settings)])

    configs = [{"algo": "fedavg", "algo.lr": 0.02, "partition.alpha": 0.1},
               {"algo": "fedprox", "algo.lr": 0.01, "algo.mu": 0.01, "partition.alpha": 0.1},
               {"algo": "fedprox", "algo.lr": 0.01, "algo.mu": 0.1, "partition.alpha": 0.1},
               {"algo": "fedprox", "algo.lr": 0.01, "algo.mu": 0.1, "partition.alpha": 0.5}]
    varying = ["algo", "algo.lr", "algo.mu", "partition.alpha"]
    groups = [group(f"g{i}", c, varying) for i, c in enumerate(configs)]
    names, title = short_labels(groups)
    assert list(names.values()) == ["fedavg, partition.alpha=0.1", "fedprox, mu=0.01, partition.alpha=0.1",
                                    "fedprox, mu=0.1, partition.alpha=0.1", "fedprox, mu=0.1, partition.alpha=0.5"]
    assert title is None


@pytest.mark.parametrize("fmt, magic", [("pdf", b"%PDF"), ("svg", b"<?xml")])
def test_report_figure_in_the_file_type_asked_for(hand_sweep, tmp_path, fmt, magic):
    r = report([str(hand_sweep), "--out", str(tmp_path / "out"), "--format", fmt], tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / f"summary.{fmt}").read_bytes().startswith(magic)
    assert not (tmp_path / "out" / "summary.png").exists()


def test_a_panel_whose_curves_hold_no_number_is_left_out(tmp_path, monkeypatch):
    """e.g. unseen clients' accuracy in jobs that kept none: no empty panel, no blank grid cell."""
    import fedrun.plots

    seen = []
    monkeypatch.setattr(fedrun.plots, "save_figure", lambda fig, path, title="": seen.append(fig))
    curve = pd.DataFrame({"round": [1, 2], "mean": [0.5, 0.6], "std": [0.01, 0.02]})
    empty = pd.DataFrame({"round": [1, 2], "mean": [math.nan, math.nan], "std": [math.nan, math.nan]})
    fedrun.plots.plot_curve_panels([("a", {"x": curve}), ("b", {"x": empty}), ("c", {"x": curve, "y": empty}),
                                    ("d", {"x": curve})], str(tmp_path / "f.png"))
    fig, = seen
    assert [ax.get_title() for ax in fig.axes] == ["a", "c", "d"]
    assert [len(ax.get_lines()) for ax in fig.axes] == [1, 1, 1]

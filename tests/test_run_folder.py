"""A run folder nothing can corrupt (issue 25): a refused command leaves a finished run's record as
it was, one process writes a folder at a time, a crashed or killed run leaves nothing that a rerun or
fedrun-report misreads.

Runs are the CLI in this process (helpers.fedrun); the signal tests start a process (and refuse a second
one on its folder while it runs)."""
import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch
from helpers import fedrun

# data.seed=9: 2,435 synthetic rows for 6 clients
TINY = ["data.num_clients=6", "data.seed=9", "tau=2", "clients_per_round=3", "progress=false", "plot=false"]


def _record(run_dir) -> dict:
    return {f: (run_dir / ".hydra" / f).read_bytes() for f in ("config.yaml", "hydra.yaml", "overrides.yaml")}


def test_a_refused_rerun_leaves_the_finished_runs_record_as_it_was(tmp_path):
    run_dir = tmp_path / "X"
    r = fedrun([*TINY, "rounds=3", f"hydra.run.dir={run_dir}"], tmp_path)
    assert r.returncode == 0, r.stderr
    before = _record(run_dir)
    metrics = (run_dir / "metrics.csv").read_bytes()
    # another configuration's checkpoint; a value validation refuses; a folder Hydra already made
    for bad in (["algo=fedavg", "tau=5", "rounds=3"], ["rounds=0"]):
        r = fedrun([*TINY, *bad, f"hydra.run.dir={run_dir}"], tmp_path)
        assert r.returncode == 2, (bad, r.stderr)
        assert _record(run_dir) == before, bad
        assert (run_dir / "metrics.csv").read_bytes() == metrics
    # an accepted rerun that continues the run records the rounds it now has
    r = fedrun([*TINY, "rounds=4", f"hydra.run.dir={run_dir}"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "rounds=4" in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert "rounds: 4" in (run_dir / ".hydra" / "config.yaml").read_text()


def test_resume_from_a_file_takes_that_file(tmp_path):
    """resume=<file> continues from that checkpoint, whatever its name, not the folder's newest."""
    first = tmp_path / "first"
    r = fedrun([*TINY, "rounds=4", "checkpoint_every=2", f"hydra.run.dir={first}"], tmp_path)
    assert r.returncode == 0, r.stderr
    older = first / "checkpoints" / "round_0000002.pt"
    assert older.exists() and (first / "checkpoints" / "round_0000004.pt").exists()
    renamed = tmp_path / "mine.ckpt"
    renamed.write_bytes(older.read_bytes())
    for i, ck in enumerate((older, renamed)):
        r = fedrun([*TINY, "rounds=4", f"resume={ck}", f"hydra.run.dir={tmp_path / f'second{i}'}"], tmp_path)
        assert r.returncode == 0, r.stderr
        assert f"resuming from {ck} (round 2)" in r.stderr
        assert (tmp_path / f"second{i}" / "metrics.csv").read_bytes() == (first / "metrics.csv").read_bytes()
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    r = fedrun([*TINY, "rounds=4", f"resume={tmp_path / 'junk.pt'}", f"hydra.run.dir={tmp_path / 'third'}"], tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "junk.pt" in r.stderr and "not a readable fedrun checkpoint" in r.stderr
    assert "not a file torch.save wrote" in r.stderr
    # a checkpoint whose pickle would run code when loaded: refused, and the code never runs
    evil, ran = tmp_path / "evil.pt", tmp_path / "payload_ran"
    torch.save({"version": 1, "round": 2, "x": _Payload(str(ran))}, evil)
    r = fedrun([*TINY, "rounds=4", f"resume={evil}", f"hydra.run.dir={tmp_path / 'fourth'}"], tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "holds objects other than tensors" in r.stderr and not ran.exists()


class _Payload:
    """Unpickling it would create the file `path` (what an attacker's os.system would do instead)."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


# ------------------------------------------------------------------- what fedrun-report believes

def _report(args):
    import contextlib
    import io

    from fedrun.report import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def _job(folder, seed, accs, beta=0.1, status="finished"):
    import json

    import yaml

    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(
        {"seed": seed, "rounds": len(accs), "eval_every": 1, "algo": {"_target_": "x.PerFedAvg", "beta": beta}}))
    rows = "".join(f"{r},{3 * r},1.0,{a},{a - 0.1},{a + 0.1}\n" for r, a in enumerate(accs, start=1))
    (folder / "metrics.csv").write_text("round,models_transmitted,train_loss,pers_acc,pers_acc_min,pers_acc_max\n"
                                        + rows)
    (folder / "summary.json").write_text(json.dumps({"status": status, "seconds": 1.0}))


def test_report_leaves_out_a_half_written_row_and_labels_a_failed_job_by_its_option(tmp_path):
    _job(tmp_path / "a", 0, [0.5, 0.6])
    _job(tmp_path / "b", 1, [0.5, 0.8])
    with open(tmp_path / "b" / "metrics.csv", "r+b") as f:  # a kill in the middle of the last row
        f.truncate(f.seek(0, 2) - 9)
    _job(tmp_path / "c", 0, [0.5, float("nan")], beta=100.0, status="diverged")
    code, out, err = _report([tmp_path, "--no-figure"])
    assert code == 0, err
    table = pd.read_csv(tmp_path / "summary.csv")
    assert table["n_seeds"].tolist() == [1] and table["pers_acc_last_round_mean"].tolist() == [0.6]
    assert f"left out {tmp_path / 'b'}: metrics.csv ends in a half-written row (line 3" in out
    md = (tmp_path / "summary.md").read_text()
    assert "algo.beta=100.0, seed 0: diverged" in md


def _damaged(folder, how):
    if how == "summary []":
        (folder / "summary.json").write_text("[]")
    elif how == "summary not UTF-8":
        (folder / "summary.json").write_bytes(b'{"status": "finished\xff"}')
    elif how == "corrupt config.yaml":
        (folder / ".hydra" / "config.yaml").write_text("seed: [0\n  : :\n")
    elif how == "config.yaml not UTF-8":
        (folder / ".hydra" / "config.yaml").write_bytes(b"seed: 0\nrounds: 2\nalgo: \xff\n")
    elif how == "another tool's folder":
        (folder / ".hydra" / "config.yaml").write_text("db:\n  driver: mysql\n")
    elif how in ("NaN accuracy", "round abc", "metrics not UTF-8"):
        lines = (folder / "metrics.csv").read_text().splitlines()
        cells = lines[-1].split(",")
        if how == "NaN accuracy":
            cells[3] = "nan"
        elif how == "round abc":
            cells[0] = "abc"
        lines[-1] = ",".join(cells)
        text = "\n".join(lines) + "\n"
        (folder / "metrics.csv").write_bytes(text.encode() + (b"\xff\n" if how == "metrics not UTF-8" else b""))


BAD_JOBS = [("summary []", "summary.json holds a JSON list, not a fedrun summary"),
            ("summary not UTF-8", "unreadable summary.json"),
            ("corrupt config.yaml", "unreadable .hydra/config.yaml (ParserError at line 2)"),
            ("config.yaml not UTF-8", "unreadable .hydra/config.yaml (UnicodeDecodeError)"),
            ("another tool's folder", "not a fedrun run"),
            ("NaN accuracy", "metrics.csv has non-finite accuracies on line 3 (pers_acc: nan"),
            ("round abc", "metrics.csv has round 'abc' on line 3, not a round number"),
            ("metrics not UTF-8", "metrics.csv is not UTF-8 text")]


@pytest.mark.parametrize("how, says", BAD_JOBS, ids=[h for h, _ in BAD_JOBS])
def test_report_leaves_a_bad_job_out_with_its_reason(how, says, tmp_path):
    _job(tmp_path / "a", 0, [0.5, 0.6])
    _job(tmp_path / "b", 1, [0.5, 0.8])
    _damaged(tmp_path / "b", how)
    code, out, err = _report([tmp_path, "--no-figure"])
    assert code == 0, err
    assert "2 jobs, 1 finished" in out
    assert f"left out {tmp_path / 'b'}: {says}" in out, out
    assert pd.read_csv(tmp_path / "summary.csv")["pers_acc_last_round_mean"].tolist() == [0.6]


@pytest.mark.parametrize("launcher", ["basic", "batched"])
def test_report_tells_a_failed_job_from_one_that_never_started(launcher, tmp_path):
    """A sweep whose jobs are refused in the job (resume=true, no checkpoint) stops: a failed job
    keeps its folder with its one-line reason, which the report shows. The basic launcher stops at
    the first (the second never started); the batched one had accepted or refused both."""
    sweep = tmp_path / "sweep"
    r = fedrun(["-m", *TINY, "rounds=2", "resume=true", "algo.beta=0.001,0.002", f"hydra/launcher={launcher}",
                f"hydra.sweep.dir={sweep}"], tmp_path)
    assert r.returncode == 2 and "there is no checkpoint" in r.stderr
    code, out, err = _report([sweep, "--no-figure"])
    assert code == 0, err
    failed = [line for line in out.splitlines() if line.startswith("fedrun-report: left out")]
    assert all(": failed: resume=True but there is no checkpoint" in line for line in failed), out
    missing = [line for line in out.splitlines() if line.startswith("fedrun-report: missing:")]
    if launcher == "basic":
        assert len(failed) == 1 and len(missing) == 1 and "job 1 (algo.beta=0.002) never started" in missing[0], out
    else:
        assert len(failed) == 2 and not missing, out
    r = fedrun(["-m", *TINY, "rounds=2", "algo.beta=0.001,0.002", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "2 jobs, 2 finished" in _report([sweep, "--no-figure"])[1]  # the rerun's job: its reason gone


@pytest.mark.parametrize("hydra_yaml", ["readable", "unreadable"])
def test_report_says_a_job_s_config_is_unreadable_not_that_it_never_started(hydra_yaml, tmp_path):
    """A sweep's job whose .hydra/config.yaml cannot be read (not UTF-8) has its folder: the report
    leaves it out naming that file, and does not list it as a job that never started (its number
    read from its hydra.yaml, or, that one unreadable too, from its folder's `<num>_` name)."""
    import yaml

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {
        "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper", "params": {}},
        "overrides": {"task": ["algo.beta=0.001,0.002"]}}}))
    for num, beta in ((0, 0.001), (1, 0.002)):
        folder = sweep / f"{num}_algo.beta={beta}"
        _job(folder, 0, [0.5, 0.6], beta=beta)
        (folder / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"num": num}}}))
    bad = sweep / "1_algo.beta=0.002"
    (bad / ".hydra" / "config.yaml").write_bytes(b"seed: 0\nalgo: \xff\n")
    if hydra_yaml == "unreadable":
        (bad / ".hydra" / "hydra.yaml").write_bytes(b"hydra: \xff\n")
    code, out, err = _report([sweep, "--no-figure"])
    assert code == 0, err
    assert f"left out {bad}: unreadable .hydra/" in out and "never started" not in out, out
    assert "missing" not in out, out


def test_report_lists_the_jobs_of_a_sweep_that_never_started(tmp_path):
    """A sweep stopped by its second job (diverged: lr 1e30; a job refused by its options stops the
    sweep before any job starts, test_batched.py): the report leaves that job out, saying why, and
    names the third, which never ran, with its overrides."""
    sweep = tmp_path / "sweep"
    r = fedrun(["-m", *TINY, "rounds=2", "algo.beta=0.001,1e30,0.002", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert r.returncode == 3 and "produced NaN/inf parameters" in r.stderr
    code, out, err = _report([sweep, "--no-figure"])
    assert code == 0, err
    assert "2 jobs, 1 finished" in out
    assert any(line.startswith("fedrun-report: left out") and "algo.beta=1e+30" in line
               and ": diverged: round 1" in line
               for line in out.splitlines()), out
    missing = [line for line in out.splitlines() if line.startswith("fedrun-report: missing:")]
    assert len(missing) == 1 and "job 2 (algo.beta=0.002" in missing[0], out


# ------------------------------------------------------------------- faults around the edges

def test_a_full_cache_disk_warns_and_goes_on_in_memory(tmp_path, monkeypatch, capsys):
    import torch

    from fedrun.data import synthetic

    def full_disk(obj, f, *a, **k):  # what torch's zip writer does when the disk fills mid-file
        with open(f, "wb") as fh:
            fh.write(b"\0" * 4096)
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 909312 vs 909200")

    monkeypatch.setattr(torch, "save", full_disk)
    data = synthetic(num_clients=4, seed=9, cache_dir=str(tmp_path / "cache"))
    assert data.num_clients == 4
    err = capsys.readouterr().err
    assert "could not write the data cache" in err and "going on with the data in memory" in err
    assert os.listdir(tmp_path / "cache") == []  # no partial file left


def test_a_finished_run_without_its_figure_gets_it_on_rerun(tmp_path):
    run_dir = tmp_path / "X"
    args = [*TINY, "rounds=2", f"hydra.run.dir={run_dir}"]
    assert fedrun(args, tmp_path).returncode == 0  # plot=false: as a kill between summary.json and the figure
    assert not (run_dir / "metrics.png").exists()
    r = fedrun([*args, "plot=true"], tmp_path)
    assert r.returncode == 0 and "already finished" in r.stdout, r.stderr
    assert (run_dir / "metrics.png").stat().st_size > 1000


def test_checkpoints_by_time_as_well_as_by_rounds(tmp_path):
    run_dir = tmp_path / "X"
    r = fedrun([*TINY, "rounds=3", "checkpoint_every=0", "checkpoint_minutes=1e-9", f"hydra.run.dir={run_dir}"],
               tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["round_0000002.pt", "round_0000003.pt"]


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_before_the_first_checkpoint_keeps_the_last_round(sig, status, tmp_path):
    """Ctrl-C or SIGTERM long before the first checkpoint (checkpoint_every=100000): the last
    finished round is checkpointed, one line says where it stopped, the exit status is the shell's
    for that signal, and the rerun goes on to the numbers of an uninterrupted run.
    While the run is busy, a second process on its folder (this one) is refused in one line naming the
    first's pid, before it reads or writes anything (checked once, on the Ctrl-C case's run: the lock does
    not depend on the signal that ends the run). (The lock a SIGKILL leaves behind: test_resume's
    rerun after a kill.)"""
    run_dir = tmp_path / "X"
    env = {**os.environ, "FEDRUN_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "fedrun.cli", *TINY, "rounds=100000", "checkpoint_every=100000",
                          f"hydra.run.dir={run_dir}"], cwd=tmp_path, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         # a shell's background job starts with SIGINT ignored, and its children
                         # inherit that (then Ctrl-C never reaches fedrun): the terminal's default here
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 120
        while not (run_dir / "metrics.csv").is_file() or len((run_dir / "metrics.csv").read_text().splitlines()) < 4:
            assert p.poll() is None, p.stderr.read()
            assert time.time() < deadline
            time.sleep(0.05)
        if sig == signal.SIGINT:  # the refusal does not depend on the signal sent later: checked once
            record = _record(run_dir)
            r = fedrun([*TINY, "rounds=3", "checkpoint_every=0", f"hydra.run.dir={run_dir}"], tmp_path)
            assert r.returncode == 2
            refused = r.stderr.strip().splitlines()
            assert len(refused) == 1 and f"pid {p.pid}" in refused[0] and "hydra.run.dir" in refused[0], r.stderr
            assert p.poll() is None
            assert _record(run_dir) == record
            assert not (run_dir / "metrics.csv.previous").exists()
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == status, err
    # the cost estimate printed after the first rounds (fedrun.clock) is the only other line
    # (and, on a loaded machine, its hint that the run takes hours)
    lines = [line for line in err.strip().splitlines() if not line.startswith(("fedrun: estimated time",
                                                                               "fedrun: hint:"))]
    assert len(lines) == 1 and "interrupted after round" in lines[0], err
    (saved,) = os.listdir(run_dir / "checkpoints")
    rnd = int(saved[len("round_"):-len(".pt")])
    assert rnd >= 3 and f"interrupted after round {rnd} " in lines[0]
    assert lines[0].endswith(f"rerun the same command to resume from round {rnd}")
    r = fedrun([*TINY, f"rounds={rnd + 2}", f"hydra.run.dir={run_dir}"], tmp_path)
    assert r.returncode == 0 and f"resuming from {run_dir / 'checkpoints' / saved}" in r.stderr, r.stderr
    r = fedrun([*TINY, f"rounds={rnd + 2}", f"hydra.run.dir={tmp_path / 'Y'}"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert (run_dir / "metrics.csv").read_bytes() == (tmp_path / "Y" / "metrics.csv").read_bytes()


# ------------------------------------------------------------------- records that say what they are

def test_summary_names_its_run_and_the_figure_says_what_it_draws(tmp_path, monkeypatch):
    import json

    import fedrun.plots as plots

    drawn = []
    real_save = plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, out, title="": (
        drawn.append(fig) if str(out).endswith("metrics.png") else None, real_save(fig, out, title)))
    run_dir = tmp_path / "X"
    r = fedrun([*TINY, "algo=pfedme", "rounds=3", "seed=4", "plot=true", f"hydra.run.dir={run_dir}"], tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {k: summary[k] for k in ("algo", "data", "model", "seed")} == {"algo": "pfedme", "data": "synthetic",
                                                                          "model": "dnn", "seed": 4}
    (fig,) = drawn
    labels = [t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()]
    assert not any("1 step on own train data" in t for t in labels), labels
    assert "personalized (pfedme's own personalization) (pooled)" in labels
    for ax in fig.axes:  # whole rounds only
        assert all(float(t).is_integer() for t in ax.get_xticks())
    # the client band is the inter-quartile range, with the lowest decile's line (not the 0-1 min-max)
    assert labels.count("middle half of its clients (p25-p75)") == 2
    assert labels.count("lowest tenth of its clients below (p10)") == 2
    # neither loss line hides the other: each test loss wide, the train loss thin, dashed and over them
    lines = {line.get_label(): line for line in fig.axes[1].get_lines()}
    train = lines.pop("train loss, global model")
    assert train.get_linestyle() != "-" and sorted(lines) == [
        "test loss, global model", "test loss, personalized (pfedme's own personalization)"]
    for line in lines.values():
        assert line.get_linewidth() >= 2 * train.get_linewidth() and line.get_zorder() < train.get_zorder()
    _assert_legends_clear_of_labels(fig)
    assert not (run_dir / "cli.log").exists()  # Hydra's job log was always empty: not written


def test_metrics_png_names_dataset_and_partition_and_draws_the_unseen_clients(tmp_path, monkeypatch):
    """A composed run (dataset= x partition=) with held-out clients: metrics.png's title names the
    dataset and the partition (not `composed`); its accuracy panel draws the unseen clients' global and
    personalized accuracy (metrics.csv new_*_acc), each below its model's column in the legend, and
    its loss panel their test losses, the same numbers as metrics.csv's."""
    import fedrun.plots as plots

    drawn = []
    real_save = plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, out, title="": (
        drawn.append((fig, title)) if str(out).endswith("metrics.png") else None, real_save(fig, out, title)))
    run_dir = tmp_path / "X"
    r = fedrun(["dataset=synthetic", "dataset.num_clients=8", "dataset.seed=9", "partition.holdout=2", "algo=fedavg",
                "tau=2", "clients_per_round=3", "rounds=2", "progress=false", "plot=true", "partition=natural",
                f"hydra.run.dir={run_dir}"], tmp_path)
    assert r.returncode == 0, r.stderr
    (fig, title), = drawn
    assert title == "fedavg on synthetic, partition=natural, seed 0"
    acc, loss = fig.axes
    texts = [t.get_text() for t in acc.get_legend().get_texts()]
    pers = "personalized (fedavg's own personalization)"
    assert texts == ["global model (pooled)", "middle half of its clients (p25-p75)",
                     "lowest tenth of its clients below (p10)", "unseen clients, global model (pooled)",
                     f"{pers} (pooled)", "middle half of its clients (p25-p75)",
                     "lowest tenth of its clients below (p10)", f"unseen clients, {pers} (pooled)"]
    m = pd.read_csv(run_dir / "metrics.csv")
    lines = {line.get_label(): line for ax in (acc, loss) for line in ax.get_lines()}
    for label, column in (("unseen clients, global model (pooled)", "new_global_acc"),
                          (f"unseen clients, {pers} (pooled)", "new_pers_acc"),
                          ("test loss, unseen clients, global model", "new_global_loss"),
                          (f"test loss, unseen clients, {pers}", "new_pers_loss")):
        assert lines[label].get_ydata().tolist() == m[column].tolist(), label
    _assert_legends_clear_of_labels(fig)


def _assert_legends_clear_of_labels(fig):
    """No legend overlaps a panel's plotting area or an axis label (as drawn)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # (the saved figure was closed)
    canvas.draw()
    r = canvas.get_renderer()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends)
    assert legends
    for leg in legends:
        box = leg.get_window_extent(r)
        for ax in fig.axes:
            for other in (ax.get_window_extent(r), ax.xaxis.label.get_window_extent(r),
                          ax.yaxis.label.get_window_extent(r)):
                assert not box.overlaps(other), (leg, ax)


def test_metrics_quantiles_are_the_clients_and_summary_png_legend_is_clear(tmp_path, monkeypatch):
    """metrics.csv's <m>_acc_p10/p25/p75 are the quantiles of the clients' accuracies that clients.csv
    holds for the last round; fedrun-report's summary.png draws whole rounds and its legend clear of
    the panels and the axis labels."""
    import numpy as np

    import fedrun.plots as plots

    run_dir = tmp_path / "X"
    r = fedrun([*TINY, "rounds=2", "seed=1", f"hydra.run.dir={run_dir}"], tmp_path)
    assert r.returncode == 0, r.stderr
    last = pd.read_csv(run_dir / "metrics.csv").iloc[-1]
    clients = pd.read_csv(run_dir / "clients.csv")
    for m in ("global", "pers"):
        acc = clients[f"{m}_acc"].to_numpy()
        for name, q in (("p10", 0.10), ("p25", 0.25), ("p75", 0.75)):
            assert abs(last[f"{m}_acc_{name}"] - np.quantile(acc, q)) < 1e-6, (m, name)
        assert last[f"{m}_acc_min"] <= last[f"{m}_acc_p10"] <= last[f"{m}_acc_p25"] <= last[f"{m}_acc_p75"] \
            <= last[f"{m}_acc_max"]
    drawn = []
    real_save = plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, out,
                        title="": (drawn.append(fig), real_save(fig, out, title)))
    code, out, err = _report([run_dir, "--out", tmp_path / "rep"])
    assert code == 0, err
    (fig,) = drawn
    for ax in fig.axes:
        if ax.get_visible():
            assert all(float(t).is_integer() for t in ax.get_xticks())
    _assert_legends_clear_of_labels(fig)


def test_resuming_a_checkpoint_from_before_a_metrics_column_keeps_metrics_csv_one_table(tmp_path):
    """A checkpoint written before metrics.csv had the client quantile columns: the resumed run's
    metrics.csv is one table (one header, every row as many fields), the old rows with them empty."""
    import torch

    from fedrun import outputs

    run_dir = tmp_path / "X"
    assert fedrun([*TINY, "rounds=2", "checkpoint_every=1", f"hydra.run.dir={run_dir}"], tmp_path).returncode == 0
    path = str(run_dir / "checkpoints" / "round_0000001.pt")
    ck = torch.load(path, weights_only=True)
    old = [k for k in ck["history"][0] if k.endswith(("_p10", "_p25", "_p75"))]
    assert len(old) == 6
    ck["history"] = [{k: v for k, v in row.items() if k not in old} for row in ck["history"]]
    torch.save(ck, path)
    os.remove(run_dir / "checkpoints" / "round_0000002.pt")
    r = fedrun([*TINY, "rounds=3", f"hydra.run.dir={run_dir}"], tmp_path)
    assert r.returncode == 0 and "resuming from" in r.stderr, r.stderr
    lines = (run_dir / "metrics.csv").read_text().splitlines()
    assert len(lines) == 4 and len({line.count(",") for line in lines}) == 1, lines
    m = pd.read_csv(run_dir / "metrics.csv")
    assert m["round"].tolist() == [1, 2, 3] and m["pers_acc_p25"].isna().tolist() == [True, False, False]
    assert outputs.checkpoint_paths(str(run_dir / "checkpoints"))


def test_ctrl_c_inside_a_checkpoint_write_is_a_clean_interrupt(tmp_path):
    """A Ctrl-C while torch.save writes a checkpoint surfaces as KeyboardInterrupt (the run's handler
    then says where it stopped), leaves no temp file and no torn checkpoint. torch.save into a Python
    file turned it into `RuntimeError: unexpected pos` (or, at exit, an abort: 'write to closed file')."""
    import random
    import signal

    import torch

    from fedrun.outputs import checkpoint_paths, read_checkpoint, save_checkpoint

    x = torch.randn(2_000_000)

    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    rng, interrupted = random.Random(0), 0
    try:
        for rnd in range(1, 31):
            signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.0005, 0.01))
            try:
                save_checkpoint(str(tmp_path), rnd, {"x": x})
                signal.setitimer(signal.ITIMER_REAL, 0)
            except KeyboardInterrupt:
                interrupted += 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert interrupted >= 3  # the timer did land inside writes
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    for path in checkpoint_paths(str(tmp_path)):
        assert torch.equal(read_checkpoint(path)["x"], x)


# ------------------------------------------------------------------- places fedrun cannot write

def _read_only(monkeypatch, folder):
    """`folder` as a read-only mount shows it, for this process (root writes anywhere, and a test
    cannot mount): os.access says no, and creating or opening anything in it for writing fails with
    EROFS, as Linux's calls do."""
    import builtins
    import errno

    folder = os.path.abspath(folder)
    inside = lambda p: (os.path.abspath(os.fspath(p)) == folder
                        or os.path.abspath(os.fspath(p)).startswith(folder + os.sep))
    refuse = lambda p: OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(p))
    real_open, real_os_open, real_mkdir, real_access = builtins.open, os.open, os.mkdir, os.access

    def open_(file, mode="r", *a, **k):
        if isinstance(file, (str, os.PathLike)) and inside(file) and any(c in mode for c in "wax+"):
            raise refuse(file)
        return real_open(file, mode, *a, **k)

    def os_open(path, flags, *a, **k):
        if inside(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise refuse(path)
        return real_os_open(path, flags, *a, **k)

    def mkdir(path, *a, **k):
        if inside(path):
            raise refuse(path)
        return real_mkdir(path, *a, **k)

    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if inside(p) and mode & os.W_OK
                        else real_access(p, mode, *a, **k))


def _one_line(r, *says):
    lines = [line for line in r.stderr.strip().splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("fedrun: error: "), r.stderr
    assert all(s in lines[0] for s in says), lines[0]


def test_every_unwritable_output_place_is_one_line(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    (tmp_path / "afile").write_text("x")
    _read_only(monkeypatch, ro)
    _one_line(fedrun([*TINY, "rounds=1", f"hydra.run.dir={ro}"], tmp_path), f"hydra.run.dir={ro}", "read-only")
    _one_line(fedrun([*TINY, "rounds=1", f"hydra.run.dir={ro / 'x'}"], tmp_path), "read-only")
    _one_line(fedrun(["-m", *TINY, "rounds=1", "seed=0,1", f"hydra.sweep.dir={ro / 's'}"], tmp_path),
              f"hydra.sweep.dir={ro / 's'}", "read-only")
    _one_line(fedrun([*TINY, "rounds=1", f"hydra.run.dir={tmp_path / 'afile' / 'x'}"], tmp_path),
              f"{tmp_path / 'afile'} is a file, not a folder")
    assert os.listdir(ro) == []
    r = fedrun(["--cfg", "job", f"hydra.run.dir={ro}"], tmp_path)  # writes nothing: not refused
    assert r.returncode == 0 and "fedrun: error" not in r.stderr, r.stderr


def test_a_full_disk_while_drawing_partition_png_is_one_line(tmp_path, monkeypatch):
    import builtins
    import errno

    real_open = builtins.open

    def open_(file, *a, **k):
        if os.path.basename(str(file)).startswith("partition.png"):  # (partition.png.tmp.png: written, then renamed)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", open_)
    run_dir = tmp_path / "X"
    _one_line(fedrun([*TINY, "rounds=1", "plot=true", f"hydra.run.dir={run_dir}"], tmp_path),
              f"cannot write into {run_dir}: No space left on device")


def test_console_scripts_out_folder_read_only_is_one_line(tmp_path, monkeypatch, capsys):
    from fedrun.data_cli import main as data_main
    from fedrun.report import main as report_main

    r = fedrun([*TINY, "rounds=1", f"hydra.run.dir={tmp_path / 'X'}"], tmp_path)
    assert r.returncode == 0, r.stderr
    ro = tmp_path / "ro"
    ro.mkdir()
    _read_only(monkeypatch, ro)
    with pytest.raises(SystemExit) as e:
        data_main(["--out", str(ro / "p"), "data.num_clients=6", "data.seed=9"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith(f"fedrun-data: error: --out {ro / 'p'}: "), err
    assert report_main([str(tmp_path / "X"), "--out", str(ro), "--no-figure"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fedrun-report: error: --out {ro}: cannot write"), err


def test_checkpoints_that_is_a_file_is_one_line(tmp_path):
    run_dir = tmp_path / "X"
    run_dir.mkdir()
    (run_dir / "checkpoints").write_text("not a folder")
    _one_line(fedrun([*TINY, "rounds=1", f"hydra.run.dir={run_dir}"], tmp_path),
              f"{run_dir / 'checkpoints'} is not a folder")


@pytest.mark.parametrize("torn", ["", "[]", '{"status": "fini'])
def test_a_torn_summary_json_on_rerun_is_written_again(torn, tmp_path):
    run_dir = tmp_path / "X"
    args = [*TINY, "rounds=2", f"hydra.run.dir={run_dir}"]
    assert fedrun(args, tmp_path).returncode == 0
    whole = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(torn)
    r = fedrun(args, tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    again = json.loads((run_dir / "summary.json").read_text())
    assert again["status"] == "finished" and again["pers_acc_last_round"] == whole["pers_acc_last_round"]


# ------------------------------------------------------------------- resume= a file that is not a checkpoint

def test_resume_from_a_file_that_is_no_checkpoint_is_one_line_without_torchs_warnings(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("e\x01 some notes\n")  # torch.load's legacy reader: KeyError: 101 ('e')
    proto4 = tmp_path / "p4.pt"
    torch.save({"a": 1}, proto4, pickle_protocol=4)  # torch's 2-line warning about the protocol
    for path, says in ((text, "it is not a file torch.save wrote"), (proto4, "(ValueError: ")):
        r = fedrun([*TINY, "rounds=1", f"resume={path}", f"hydra.run.dir={tmp_path / 'X'}"], tmp_path)
        _one_line(r, f"resume='{path}' is not a readable fedrun checkpoint", says)


def test_a_refusal_in_a_folder_of_files_leaves_no_lock_and_a_finished_run_s_lock_stays(tmp_path):
    """Refused in a folder that holds files but no .lock (a user's folder; a finished run's whose .lock
    was cleaned away): the folder is as it was, no .lock left; a finished run's own .lock stays."""
    import fedrun.outputs as outputs

    run_dir = tmp_path / "X"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine\n")
    (run_dir / "checkpoints").write_text("a file where the checkpoint folder goes\n")  # refused by the job
    r = fedrun([*TINY, "rounds=1", f"hydra.run.dir={run_dir}"], tmp_path)
    _one_line(r, "is not a folder, and the run keeps its checkpoints there")
    assert sorted(os.listdir(run_dir)) == ["checkpoints", "notes.txt"]
    os.remove(run_dir / "checkpoints")
    assert fedrun([*TINY, "rounds=1", f"hydra.run.dir={run_dir}"], tmp_path).returncode == 0
    assert (run_dir / outputs.LOCK_NAME).exists()  # a run's .lock is left in place (docs/outputs.md)
    r = fedrun([*TINY, "rounds=1", "tau=3", f"hydra.run.dir={run_dir}"], tmp_path)
    _one_line(r, "of a different configuration")
    assert (run_dir / outputs.LOCK_NAME).exists() and (run_dir / "notes.txt").read_text() == "mine\n"


def test_a_refused_first_command_leaves_no_folder(tmp_path):
    """A fresh clone's first command, refused after Hydra made its folder (outputs/runs/<time>_...):
    neither it nor the outputs/runs/ above it stays."""
    r = fedrun([*TINY, "rounds=1", "resume=true"], tmp_path)
    _one_line(r, "resume=True but there is no checkpoint")
    assert not (tmp_path / "outputs").exists()
    os.makedirs(tmp_path / "outputs" / "runs")  # a user's own folders stay
    _one_line(fedrun([*TINY, "rounds=1", "resume=true"], tmp_path), "no checkpoint")
    assert os.listdir(tmp_path / "outputs" / "runs") == []

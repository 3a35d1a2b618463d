"""scripts/pfllib_side_by_side.py without PFLlib: its option checks and the table merged from several runs'
results (the runs themselves need a PFLlib checkout and are not part of the suite)."""
import json
import os
import sys

import pytest

from fedrun.algorithms.base import RunInfo
from fedrun.engine.tree import tree_leaves

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import pfllib_side_by_side as sbs  # noqa: E402


def _results(root: str, algo: str, fed_acc: list[float], pfl_acc: list[float], budget: list[float]) -> dict:
    meta = {"setting": "mnist_shards2", "data": ["dataset=mnist", f"dataset.root={root}"], "rounds": 10,
            "eval_every": 5, "batch_size": 50, "tau_epoch": 52, "n_train": [2625] * 20, "lr": sbs.LR,
            "pfllib_commit": "d832e76"}
    fed = {"command": "fedrun ...", "metric": sbs.ALGOS[algo][1], "wall": 1.0,
           "runs": [{"seed": s, "rounds": [5, 10], "acc": [a - 0.01, a], "seconds": 20.0}
                    for s, a in enumerate(fed_acc)]}
    per_round = sum(budget) / len(budget) if budget else None
    pfl = [{"seed": s, "rounds": [0, 5, 10], "acc": [0.1, a - 0.01, a], "budget": budget, "setup": 1.0,
            "per_round": per_round, "per_round_no_eval": None, "wall": 30.0} for s, a in enumerate(pfl_acc)]
    return {"meta": meta, algo: {"fedrun": fed, "pfllib": pfl}}


def _write(folder, results):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "side_by_side.json"), "w") as f:
        json.dump(results, f)


def test_replot_merges_runs_from_another_data_folder_and_a_server_without_budget(tmp_path, capsys):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    _write(a, _results("/data/here", "fedavg", [0.87, 0.88], [0.86], [2.0, 4.0]))
    # PFLlib's FedPHP keeps no Budget
    _write(b, _results("/elsewhere/MNIST", "fedphp", [0.97, 0.98], [0.975, 0.985], []))
    assert sbs.main(["--replot", f"{a},{b}"]) == 0
    table = open(os.path.join(a, "side_by_side.md")).read()
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| fed")}
    assert set(rows) == {"fedavg", "fedphp"}
    assert "| +1.50 |" in rows["fedavg"] and "| 3.00 |" in rows["fedavg"]  # 87.5 - 86.0; PFLlib's mean Budget
    assert "| -0.50 |" in rows["fedphp"]  # 97.5 - 98.0
    assert "| n/a |" in rows["fedphp"]


def test_replot_refuses_runs_of_another_setting(tmp_path, capsys):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    _write(a, _results("/data", "fedavg", [0.87], [0.86], [2.0]))
    other = _results("/data", "fedphp", [0.97], [0.975], [2.0])
    other["meta"]["rounds"] = 20
    _write(b, other)
    assert sbs.main(["--replot", f"{a},{b}"]) == 2
    assert "ran other settings" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [(["--jobs", "0"], "--jobs 0"), (["--device", "tpu"], "--device tpu"),
                                         (["--algos", "fedx"], "--algos fedx"),
                                         (["--setting", "cifar10"], "--setting cifar10"),
                                         (["--setting", "mnist_x"], "--setting mnist_x"),
                                         (["--setting", "mnist_dir01", "--algos", "fedavg,ditto"], "--algos ditto"),
                                         (["--fedrun-masked"], "--fedrun-masked"),
                                         (["--setting", "mnist_dir01", "--fedrun-masked", "--jobs", "2"],
                                          "--fedrun-masked"),
                                         (["--rounds-pair", "4,1", "--eval-every", "1"], "4,1 is not allowed; "
                                          "give two round counts R1,R2 with 1 <= R1 < R2"),
                                         (["--rounds-pair", "0,4", "--eval-every", "1"], "0,4 is not allowed; "
                                          "give two round counts R1,R2 with 1 <= R1 < R2"),
                                         (["--rounds-pair", "1,x"], "--rounds-pair 1,x"),
                                         (["--rounds-pair", "1,2,3"], "--rounds-pair 1,2,3"),
                                         (["--rounds-pair", "5,15", "--eval-every", "10"], "--eval-every 10"),
                                         (["--rounds-pair", "5,10", "--jobs", "2"], "--jobs 2")])
def test_bad_options_are_one_line_before_any_work(argv, words, tmp_path, capsys):
    assert sbs.main(argv + ["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err
    assert not os.path.exists(tmp_path / "out")


def test_cifar100_setting_exports_images_of_its_partition(tmp_path):
    """--setting cifar100_dir01_resnet18: every client's rows into PFLlib's layout as images (3 x 32 x 32, for
    PFLlib's ResNet-18), all of the partition's training rows; the MNIST setting's stay flat (the MLP)."""
    import _paper
    import numpy as np

    root = _paper.write_tiny_cifar(str(tmp_path / "data"), 100, 2, 1)
    opts = sbs.setting_options(root, "cifar100_dir01_resnet18") + ["partition.num_clients=3", "partition.min_size=2"]
    folder = str(tmp_path / "Cifar100_fedrun_dir01")
    sizes = sbs.export(opts, folder, flat=False)
    assert len(sizes) == 3 and len(os.listdir(os.path.join(folder, "train"))) == 3
    rows = 0
    for c, n in enumerate(sizes):
        d = np.load(os.path.join(folder, "train", f"{c}.npz"), allow_pickle=True)["data"].item()
        assert d["x"].shape == (n, 3, 32, 32) and d["x"].dtype == np.float32 and len(d["y"]) == n
        rows += n
    test_rows = sum(len(np.load(os.path.join(folder, "test", f"{c}.npz"), allow_pickle=True)["data"].item()["y"])
                    for c in range(3))
    assert rows + test_rows == 300  # 2 + 1 images of each of the 100 classes, every one dealt to a client
    assert sbs.SETTINGS["cifar100_dir01_resnet18"]["per_round"] == 10  # the table's 10 of 100 a round


def test_replot_shows_the_masked_epochs_beside(tmp_path, capsys):
    a = str(tmp_path / "a")
    res = _results("/data", "fedrep", [0.95], [0.96], [6.0])
    res["meta"]["setting"] = "mnist_dir01"
    masked = json.loads(json.dumps(res["fedrep"]["fedrun"]))
    for r in masked["runs"]:
        r["seconds"] = 50.0  # 5 s/round against fedrun's 2
    res["fedrep"]["fedrun_masked"] = masked
    res["fedrep"]["fedrun"]["cpu"], masked["cpu"] = 15.0, 45.0  # 1.5 and 4.5 CPU s/round (1 seed, 10 rounds)
    res["fedrep"]["pfllib"][0]["cpu_per_round"] = 6.0
    _write(a, res)
    assert sbs.main(["--replot", a]) == 0
    table = open(os.path.join(a, "side_by_side.md")).read()
    row = [line for line in table.splitlines() if line.startswith("| fedrep | 2.00 | 5.00 |")]
    assert len(row) == 1 and "| 2.50x |" in row[0] and "| 1.2x |" in row[0]  # 5 / 2; PFLlib 6 / masked 5
    assert "| fedrep | 1.50 | 6.00 | 4.0x | 4.50 | 3.00x |" in table  # the CPU seconds


def test_the_masked_runner_replaces_the_sorted_epochs(monkeypatch):
    """--fedrun-masked's runner swaps simulate._epochs_by_work for the masked steps, which give the same numbers."""
    import torch

    import fedrun.simulate as simulate
    from fedrun.algorithms import build
    from fedrun.data import synthetic
    from fedrun.engine import ENGINES, params_of
    from fedrun.models import MLP
    from fedrun.simulate import Schedule, round_draws

    monkeypatch.setattr(simulate, "_epochs_by_work", simulate._epochs_by_work)  # restored after the test
    code = sbs.MASKED.split("sys.argv[0]")[0]  # its definitions, not its call of fedrun's main
    data = synthetic(num_clients=6, size_factor=1, seed=9, cache_dir=None)
    sched = Schedule(rounds=1, tau=1, clients_per_round=4, batch_size=5)
    out = []
    for patch in (False, True):
        if patch:
            exec(code, {})
            assert simulate._epochs_by_work.__name__ == "masked"
        torch.manual_seed(0)
        model = MLP(data.in_features, data.num_classes, hidden=[4])
        algo = build("fedavg", local_epochs=1)
        algo = algo.bind(RunInfo.of(sched, data))
        state = algo.init(params_of(model), data.num_clients)
        clients, trained, idx, aug = round_draws(algo, data, sched, 0, 1)
        assert len(set(idx[0].per_pass.tolist())) > 1  # uneven clients: the two computations differ in work
        local = simulate.local_training(algo, ENGINES["vmap"](model), algo.start_local(state, trained, 1), data,
                                        idx, 1, aug)
        out.append(local)
    for x, y in zip(tree_leaves(out[0]), tree_leaves(out[1])):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_every_setting_is_baselines_and_trains_its_clients_per_round():
    """The side-by-side's settings (PFLlib's side: dataset folder, classes, clients a round) are baselines.py's
    settings of the same names with the same clients per round; the local-epochs ones among them."""
    import baselines

    assert set(sbs.SETTINGS) == {"mnist_shards2", "mnist_dir01", "cifar100_dir01_resnet18"}
    assert set(sbs.LOCAL_EPOCHS) == {"mnist_dir01"} and set(sbs.LOCAL_EPOCHS["mnist_dir01"]) <= set(sbs.ALGOS)
    for name, side in sbs.SETTINGS.items():
        assert f"clients_per_round={side['per_round']}" in baselines.SETTINGS[name]["run"], name
        data = baselines.SETTINGS[name]["data"]
        assert sbs.setting_options("/d", name)[: len(data)] == data
    assert len({side["dataset"] for side in sbs.SETTINGS.values()}) == len(sbs.SETTINGS)


def test_rounds_pair_takes_the_fixed_costs_out_of_both_sides(tmp_path, capsys):
    """--rounds-pair's columns: per run, (X(R2) - X(R1)) / (R2 - R1) and the fixed part X(R1) - R1 x that, from
    hand-made totals (fedrun one run; PFLlib two, its totals halved)."""
    assert sbs.parse_rounds_pair("1,4", 1) == [1, 4] and sbs.parse_rounds_pair("5,15", 5) == [5, 15]
    a = str(tmp_path / "a")
    res = _results("/data", "fedrep", [0.95], [0.96], [6.0])
    res["meta"].update(setting="mnist_dir01", rounds=4, eval_every=1, rounds_pair=[1, 4])
    res["fedrep"]["pair"] = {
        "fedrun": {"1": {"cpu": 10.0, "wall": 12.0, "runs": 1}, "4": {"cpu": 16.0, "wall": 21.0, "runs": 1}},
        "pfllib": {"1": {"cpu": 60.0, "wall": 70.0, "runs": 2}, "4": {"cpu": 114.0, "wall": 130.0, "runs": 2}},
        "fedrun_masked": {"1": {"cpu": 11.0, "wall": 13.0, "runs": 1}, "4": {"cpu": 20.0, "wall": 25.0, "runs": 1}}}
    _write(a, res)
    assert sbs.main(["--replot", a]) == 0
    table = open(os.path.join(a, "side_by_side.md")).read()
    # fedrun (16 - 10) / 3 = 2, fixed 10 - 2 = 8; PFLlib (57 - 30) / 3 = 9, fixed 30 - 9 = 21; wall 3 and 10;
    # masked (20 - 11) / 3 = 3
    assert "| fedrep | 2.00 | 9.00 | **4.5x** | 8.00 | 21.00 | 3.00 | 10.00 | 3.3x | 3.00 | 1.50x |" in table
    assert "R1 = 1 and R2 = 4 rounds" in table


def test_rounds_pair_runs_each_side_once_more_and_reuses_the_run_at_rounds(tmp_path, monkeypatch, capsys):
    """--rounds 4 --rounds-pair 1,4: every side run at 4 rounds (the table's run) and once more at 1, the same
    seeds; the pair's totals are those runs' (fake runs here: CPU 5 + 2 x rounds per fedrun run, 20 + 9 x rounds
    per PFLlib run)."""
    (tmp_path / "pfl" / "system" / "flcore").mkdir(parents=True)
    calls = []

    def fedrun(args, out, algo, data_opts, tau, seeds, masked=False, rounds=None):
        n = args.rounds if rounds is None else rounds
        calls.append(("fedrun_masked" if masked else "fedrun", n, tuple(seeds)))
        return {"command": "fedrun", "metric": "pers_acc", "wall": 1.0 + 3 * n * len(seeds),
                "cpu": (5.0 + (4.0 if masked else 2.0) * n) * len(seeds), "load": [0.5, 0.6],
                "runs": [{"seed": s, "rounds": list(range(1, n + 1)), "acc": [0.9] * n, "seconds": 1.0} for s in seeds]}

    def pfllib(args, out, algo, seed, rounds=None):
        n = args.rounds if rounds is None else rounds
        calls.append(("pfllib", n, seed))
        return {"seed": seed, "rounds": list(range(n + 1)), "acc": [0.9] * (n + 1), "budget": [1.0] * (n + 1),
                "setup": 1.0, "per_round": 1.0, "per_round_no_eval": None, "cpu_per_round": 9.0,
                "wall": 30.0 + 10 * n, "proc_cpu": 20.0 + 9 * n, "load": [0.6, 0.7]}

    monkeypatch.setattr(sbs, "export", lambda opts, folder, flat=True: [424, 6199])
    monkeypatch.setattr(sbs, "run_fedrun", fedrun)
    monkeypatch.setattr(sbs, "run_pfllib", pfllib)
    out = tmp_path / "out"
    assert sbs.main(["--pfllib", str(tmp_path / "pfl"), "--setting", "mnist_dir01", "--algos", "fedrep",
                     "--rounds", "4", "--rounds-pair", "1,4", "--eval-every", "1", "--seeds", "0,1",
                     "--pfllib-seeds", "0,1", "--fedrun-masked", "--out", str(out)]) == 0
    assert sorted(calls) == sorted([("fedrun", 4, (0, 1)), ("pfllib", 4, 0), ("pfllib", 4, 1),
                                    ("fedrun_masked", 4, (0, 1)), ("fedrun", 1, (0, 1)), ("pfllib", 1, 0),
                                    ("pfllib", 1, 1), ("fedrun_masked", 1, (0, 1))])
    res = json.load(open(out / "side_by_side.json"))
    assert res["meta"]["rounds_pair"] == [1, 4]
    assert res["fedrep"]["pair"]["pfllib"]["4"] == {"cpu": 2 * 56.0, "wall": 2 * 70.0, "runs": 2,
                                                    "load": [[0.6, 0.7]] * 2}
    table = open(out / "side_by_side.md").read()
    # per run: fedrun 2 CPU-s a round, fixed 5; PFLlib 9, fixed 20; wall 3 and 10; masked 4
    assert "| fedrep | 2.00 | 9.00 | **4.5x** | 5.00 | 20.00 | 3.00 | 10.00 | 3.3x | 4.00 | 2.00x |" in table

"""fedrun.bench's CIFAR setting: the CIFAR-shaped random data and a 1-round smoke run of both
engines (timings are printed, never asserted); the authors'-code timing against a stand-in main.py."""
import pytest
import torch

from fedrun.bench import cli as bench
from fedrun.bench.common import cifar_like


def test_cifar_like_has_the_acid_shape():
    d = cifar_like(clients=6, train=8, test=3, num_classes=10, k=5)
    assert d.num_clients == 6 and d.num_classes == 10 and d.augment == "crop_flip"
    assert tuple(d.train.x.shape) == (48, 3, 32, 32) and tuple(d.test.x.shape) == (18, 3, 32, 32)
    assert d.train.sizes.tolist() == [8] * 6 and d.test.sizes.tolist() == [3] * 6
    for split in (d.train, d.test):
        for c in range(6):
            y = split.y[split.client_rows(c)]
            assert set(((y - c) % 10).tolist()) <= set(range(5))  # device c's classes: (c + j) mod 10, j < 5
    assert torch.equal(cifar_like(6, 8, 3).train.x, d.train.x)  # seeded


def test_cifar_bench_smoke(capsys):
    bench.main(["--setting", "cifar", "--clients", "3", "--train-per-client", "6", "--test-per-client", "2",
                "--clients-per-round", "2", "--tau", "1", "--batch", "2", "--rounds", "1", "--loop-rounds", "1",
                "--warmup", "1", "--device", "cpu", "--algos", "fedavg"])
    out = capsys.readouterr().out
    assert "CIFAR-shaped random data: 3 devices x 6 train / 2 test images" in out and "tau=K=1" in out
    row = next(l for l in out.splitlines() if l.startswith("fedavg"))
    vmap, loop, ratio = map(float, row.split()[1:])
    assert vmap > 0 and loop > 0


def test_draws_setting_times_every_sampling(capsys):
    bench.main(["--setting", "draws", "--clients-per-round", "3", "--train-per-client", "7", "--tau", "2",
                "--batch", "4", "--rounds", "2", "--warmup", "0", "--device", "cpu"])
    out = capsys.readouterr().out
    assert "3 devices of 7 training rows" in out and "tau=2 steps of one batch of 4 rows" in out
    rows = {l.split()[0]: float(l.split()[1]) for l in out.splitlines()[2:]}
    assert set(rows) == {"replacement", "epochs", "steps"} and all(v > 0 for v in rows.values())


def test_loop_rounds_zero_times_the_vmap_engine_alone(capsys):
    bench.main(["--setting", "cifar", "--clients", "3", "--train-per-client", "6", "--test-per-client", "2",
                "--clients-per-round", "2", "--tau", "1", "--batch", "2", "--rounds", "1", "--loop-rounds", "0",
                "--warmup", "1", "--device", "cpu", "--algos", "fedavg"])
    row = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("fedavg"))
    vmap, loop, ratio = row.split()[1:]
    assert float(vmap) > 0 and loop == ratio == "-"


def test_repeats_alternate_the_engines_and_report_medians_and_the_ratio_range(capsys):
    calls = []
    times = {"vmap": iter([1.0, 3.0, 2.0]), "loop": iter([4.0, 9.0, 10.0])}  # in each engine's order

    def timed(eng, rounds):
        calls.append(eng)
        return next(times[eng])

    args = bench.argparse.Namespace(repeats=3, rounds=2, loop_rounds=1)
    res = bench._time_engines(args, timed)
    assert calls == ["vmap", "loop", "loop", "vmap", "vmap", "loop"]
    bench._print_row("x", res)
    vmap, loop, ratio, spread = capsys.readouterr().out.split()[1:]
    # medians 2.0 and 9.0; the pairs' ratios 4.0, 3.0, 5.0
    assert (float(vmap), float(loop), float(ratio), spread) == (2.0, 9.0, 4.5, "3.0-5.0")


def test_repeats_smoke_and_bad_value(capsys):
    argv = ["--setting", "cifar", "--clients", "3", "--train-per-client", "6", "--test-per-client", "2",
            "--clients-per-round", "2", "--tau", "1", "--batch", "2", "--rounds", "1", "--loop-rounds", "1",
            "--warmup", "1", "--device", "cpu", "--algos", "fedavg"]
    bench.main(argv + ["--repeats", "2"])
    out = capsys.readouterr().out
    assert "median of 2, engines alternating" in out
    assert len(next(l for l in out.splitlines() if l.startswith("fedavg")).split()) == 5
    with pytest.raises(SystemExit):
        bench.main(argv + ["--repeats", "0"])
    assert "--repeats 0: must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--seeds", "1,2", "--repeats", "2"])
    assert "--repeats times the vmap and loop engines; it does not apply to --seeds" in capsys.readouterr().err


def test_authors_timing_reads_round_banners_and_stops_their_process(tmp_path):
    # a stand-in for their main.py: a banner per round, results written only after the last round
    (tmp_path / "main.py").write_text(
        "import sys, time\n"
        "n = int(sys.argv[sys.argv.index('--num_global_iters') + 1])\n"
        "for r in range(n):\n"
        "    print('-------------Round number: ', r, ' -------------')\n"
        "    time.sleep(0.05)\n"
        "open('results.txt', 'w').write('done')\n")
    wall, cpu = bench.time_authors(tmp_path, warmup=1, rounds=2, threads=1)
    assert 0.04 < wall < 5 and (cpu is None or 0 <= cpu < wall)
    assert not (tmp_path / "results.txt").exists()  # stopped at the last timed banner


def test_authors_timing_says_when_their_code_stops_early(tmp_path):
    (tmp_path / "main.py").write_text("print('Traceback: no data')\n")
    with pytest.raises(RuntimeError, match="stopped after 0 rounds"):
        bench.time_authors(tmp_path, warmup=1, rounds=2, threads=1)


def test_authors_option_names_a_bad_path(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--authors", str(tmp_path), "--device", "cpu"])
    assert f"--authors {tmp_path}: not a work tree of CharlieDinh/pFedMe" in capsys.readouterr().err


def test_fedrun_side_of_the_authors_comparison_runs():
    """`--authors` times fedrun's pFedMe DNN with `time_pfedme` before and after their code."""
    from fedrun.data import synthetic

    data = synthetic(num_clients=10, seed=9, cache_dir=None)
    wall, cpu = bench.time_pfedme(data, rounds=1, warmup=1, device=torch.device("cpu"))
    assert wall > 0 and cpu > 0


def test_seed_bench_splits_a_round_into_the_shared_part_and_the_part_per_seed():
    from fedrun.bench.seeds import split_fixed

    # 1 seed 1.0 s, 10 seeds 5.5 s: each added seed 0.5 s, 0.5 s shared
    assert split_fixed({1: 1.0, 5: 3.0, 10: 5.5}) == (0.5, 0.5, 1.0)
    # linear scaling: nothing shared
    fixed, per_seed, one = split_fixed({1: 2.0, 4: 8.0})
    assert (fixed, per_seed, one) == (0.0, 2.0, 2.0)


def test_gpu_check_refuses_without_cuda_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        bench.main(["--gpu-check"])
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "no CUDA device is available" in err


def test_gpu_check_runs_its_whole_path_on_the_cpu(capsys):
    """The hidden `--gpu-check-device cpu`: every part at tiny sizes (agreement in float64 and
    float32, the default run, the CIFAR ACID preset on generated CIFAR-10 files, the bench, batched
    seeds, eager against compiled local steps), one table, exit 0."""
    with pytest.raises(SystemExit) as e:
        bench.main(["--gpu-check", "--gpu-check-device", "cpu"])
    out = capsys.readouterr().out
    assert e.value.code == 0, out
    table = out[out.index("part "):].splitlines()
    parts = [line.split()[0] for line in table[1:-1]]
    assert parts == ["agreement", "agreement", "default", "cifar_acid", "bench", "seeds", "compile",
                     "lr_graphs", "lr_graphs"], out
    assert "ERROR" not in out and "generated CIFAR-10 files" in out
    assert "4/4 within tolerance" in table[1] and "4/4 within tolerance" in table[2]  # mlr, mlp, cnn, mlp_bn
    assert "DIFFERS FROM EAGER" not in out and "default-fo     compiled" in out


def test_epochs_bench_counts_each_clients_epoch_and_the_steps_round_does_as_much(monkeypatch, capsys):
    """`fedrun-bench --epochs` on 6 uneven clients, 3 a round: the epoch round's client steps are sum floor(n_c / B)
    (B = 32) of the round's clients; the steps round's tau = that total / 3 rounded up, so it does at least as much;
    the masked round the same work; the sequential steps (depth): the round's largest client's steps (not the pass
    of all 6 clients' largest) against tau; the floor runs the epoch round's depth in plain steps; times and CPU
    seconds printed and returned (never asserted beyond > 0)."""
    from fedrun.algorithms import build
    from fedrun.bench import epochs as bench_epochs
    from fedrun.data import synthetic
    from fedrun.models import MLP
    from fedrun.simulate import Schedule, round_draws

    data = synthetic(num_clients=6, seed=3, dim=5, num_classes=3, cache_dir=None, chunk_len=16, size_factor=1)
    sched = Schedule(rounds=1, tau=1, clients_per_round=3, batch_size=32)
    monkeypatch.setattr(bench_epochs, "_setting", lambda name, device, root: (
        data, sched, lambda: MLP(5, 3, hidden=[4])))
    rows = bench_epochs.main(["tiny"], ["fedavg"], rounds=1, warmup=0, device="cpu")
    out = capsys.readouterr().out
    (row,) = rows
    sizes = data.train.sizes[: data.num_train_clients].tolist()
    round1 = [sizes[c] // 32 for c in round_draws(build("fedavg", local_epochs=1), data, sched, 0, 1)[1].tolist()]
    assert len(set(sizes)) > 1 and max(round1) < max(n // 32 for n in sizes)  # uneven; round 1 lacks the largest
    assert row["work"] == sum(round1)
    assert row["steps_work"] == 3 * -(-row["work"] // 3)
    assert (row["epochs_depth"], row["steps_depth"]) == (max(round1), -(-row["work"] // 3))
    assert row["floor_steps"] == row["epochs_depth"]
    assert all(row[k] > 0 for k in ("epochs_s", "masked_s", "steps_s", "epochs_cpu_s", "masked_cpu_s", "steps_cpu_s",
                                    "floor_s", "floor_cpu_s"))
    assert "depth ep/steps" in out and "ep/floor" in out
    assert out.splitlines()[-1].split()[:3] == ["tiny", "fedavg", str(row["work"])]

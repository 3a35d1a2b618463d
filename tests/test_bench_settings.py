"""`fedrun-bench --setting resnet|shakespeare|agnews --tiny` (fedrun/bench/settings.py): the data have
their settings' shapes, and each setting times both engines and prints its table."""
import pytest
import torch

from fedrun.bench import cli as bench
from fedrun.bench.settings import make_data


def test_settings_data_have_the_real_shapes():
    shapes = {name: make_data(name, clients=2, train=3, test=1) for name in ("resnet", "shakespeare", "agnews")}
    assert shapes["resnet"].feature_shape == (3, 32, 32) and shapes["resnet"].num_classes == 100
    lstm = shapes["shakespeare"]
    assert lstm.feature_shape == (80,) and lstm.num_classes == 80 and int(lstm.train.x.max()) < 80
    text = shapes["agnews"]
    assert text.feature_shape == (200,) and text.num_classes == 4 and text.train.x.dtype == torch.int64
    assert int(text.train.x.max()) < 30000 and (text.train.x[:, :20] > 0).all()  # (padding 0 only at a row's tail)


@pytest.mark.parametrize("setting", ["resnet", "shakespeare", "agnews"])
def test_settings_bench_times_both_engines(setting, capsys):
    saved = torch.get_num_threads()
    try:
        bench.main(["--setting", setting, "--tiny", "--rounds", "1", "--loop-rounds", "1", "--warmup", "0",
                    "--device", "cpu", "--threads", "1"])
    finally:
        torch.set_num_threads(saved)
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.split()[:1] in (["vmap"], ["loop"])}
    assert set(rows) == {"vmap", "loop"} and "ERROR" not in out, out
    assert all(float(v[0]) > 0 and float(v[1]) > 0 for v in rows.values()) and "loop/vmap" in out

"""What a run will cost (fedrun.clock): the estimate from hand-made round times, checked against
numbers computed here by hand, the round loop's reporter (progress bar and the estimate's line), and
the one line the round loop prints after the first rounds."""
import pytest
import torch

from fedrun.algorithms.fedavg import FedAvg
from fedrun.clock import RoundClock, RoundReporter, hms
from fedrun.data import synthetic
from fedrun.engine import VmapEngine, params_of
from fedrun.models import MLP
from fedrun.simulate import Schedule, simulate


def test_hms():
    assert (hms(9.5), hms(125), hms(3725), hms(36000)) == ("9.5s", "2m05s", "1h02m", "10h00m")


def test_evaluations_left_count_every_eval_every_th_round_and_the_last():
    c = RoundClock(rounds=25, eval_every=10)
    assert [c.evaluations_after(r) for r in (0, 9, 10, 20, 24, 25)] == [3, 3, 2, 1, 1, 0]  # 10, 20, 25
    assert RoundClock(rounds=20, eval_every=10).evaluations_after(5) == 2  # 10, 20
    assert RoundClock(rounds=7, eval_every=1).evaluations_after(3) == 4


def test_a_long_first_round_is_estimated_at_once():
    c = RoundClock(rounds=100, eval_every=1)
    c.tick(1, 30.0, 10.0)  # 20 s training + 10 s evaluation
    est = c.estimate()
    assert est.left == pytest.approx(99 * 20 + 99 * 10) and est.per_round == pytest.approx(30.0)
    assert c.tell("cpu") == ["estimated time: 30.00 s/round x 99 rounds left = 49m30s "
                             "(training 20.00 s/round, evaluation 10.00 s every round)"]  # < 1 h: no hint
    assert c.tell("cpu") == []  # once


def test_short_rounds_wait_for_the_second_and_leave_the_first_out():
    c = RoundClock(rounds=1000, eval_every=10)
    c.tick(1, 5.0)  # warm-up: left out once a second round is timed
    assert c.estimate() is None and c.tell("cpu") == []
    c.tick(2, 4.0)
    est = c.estimate()
    assert est.train == 4.0 and est.evaluation is None and est.left == pytest.approx(998 * 4.0)
    assert est.hint("cuda") is None
    lines = c.tell("cpu")
    assert lines[0].startswith("estimated time: 4.00 s/round x 998 rounds left = 1h06m")
    assert "evaluation not timed yet" in lines[0]
    assert lines[1].startswith("hint: this run takes hours on the CPU; a GPU (device=cuda) or evaluating less often")


def test_the_hint_says_the_share_of_evaluation():
    c = RoundClock(rounds=500, eval_every=2)
    for rnd, (sec, ev) in enumerate([(50.0, 0.0), (40.0, 30.0), (10.0, 0.0), (40.0, 30.0)], start=1):
        c.tick(rnd, sec, ev)
    est = c.estimate()  # training: rounds 2-4 = 10 s each; evaluation: the second timed one, 30 s
    assert est.train == pytest.approx(10.0) and est.evaluation == pytest.approx(30.0)
    assert est.left == pytest.approx(496 * 10 + 248 * 30) and est.per_round == pytest.approx(25.0)
    assert est.hint("cpu").endswith("(e.g. eval_every=10; evaluation is 60% of the time now) shortens it")  # 30/2/25


def test_a_short_run_prints_nothing_and_a_long_one_one_line(capsys, monkeypatch):
    data = synthetic(num_clients=5, dim=6, num_classes=4, seed=35, chunk_len=64)
    torch.manual_seed(0)
    model = MLP(6, 4, hidden=[5])
    sched = Schedule(rounds=4, tau=2, clients_per_round=3, batch_size=5)
    simulate(FedAvg(), VmapEngine(model), data, params_of(model), sched, 0)
    assert "estimated" not in capsys.readouterr().err
    monkeypatch.setattr("fedrun.clock.TELL_FROM_S", 0.0)  # as if the rest took a minute or more
    simulate(FedAvg(), VmapEngine(model), data, params_of(model), sched, 0)
    err = capsys.readouterr().err
    assert err.count("fedrun: estimated time: ") == 1 and "x 2 rounds left = " in err, err
    simulate(FedAvg(), VmapEngine(model), data, params_of(model), sched, 0, progress=True)
    err = capsys.readouterr().err  # the bar, closed at round 4 with that round's accuracies
    assert "fedavg: 100%" in err and "4/4 [" in err and "global=" in err and "pers=" in err, err


@pytest.mark.parametrize("progress", [False, True])
def test_the_reporter_shows_the_estimate_once_and_the_last_accuracies(progress, capsys):
    """RoundReporter.on_round, with hand-made round times: 30 s rounds, 10 s of them evaluating,
    of 4 rounds evaluated every 2nd. After round 1 (a long round: told at once) the rest is
    3 x 20 s training + 2 evaluations x 10 s = 80 s; after round 2, 2 x 20 + 1 x 10 = 50 s."""
    report = RoundReporter(RoundClock(rounds=4, eval_every=2), "cpu", "ditto", 0, progress)
    assert (report.bar is not None) == progress
    report.on_round(1, 30.0, 10.0, {"global_acc": 0.1, "pers_acc": 0.2})  # not an evaluated round: no postfix
    assert capsys.readouterr().err.count("fedrun: estimated time: 26.67 s/round x 3 rounds left = 1m20s") == 1
    if progress:
        assert report.bar.n == 1 and not report.bar.postfix
    report.on_round(2, 30.0, 10.0, {"global_acc": 0.5, "pers_acc": 0.25})
    if progress:
        assert report.bar.n == 2 and report.bar.postfix == "global=0.5000, pers=0.2500, est=25.00s x 2 = 50.0s"
    report.on_round(3, 20.0, 0.0, None)
    report.on_round(4, 30.0, 10.0, {"global_acc": 0.75})  # the last round: no time left to show
    if progress:
        assert report.bar.n == 4 and report.bar.postfix == "global=0.7500"
    report.close()
    err = capsys.readouterr().err
    assert "estimated" not in err  # once
    assert ("ditto: 100%|" in err and "4/4 [" in err and "global=0.7500]" in err) == progress, err

"""What a run will cost, told before it is long under way: after the first rounds, one line with the
measured seconds per round times the rounds left (also in the progress bar), and for a run of hours
on the CPU, what shortens it. `RoundReporter` is all the round loop calls: once a round, `on_round`.

Host wall-clock time only: no device synchronization of its own (the round loop already waits for
each round's divergence check, so a round's host time is its device time too).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

LONG_ROUND_S = 20.0  # a first round this long is measured enough: tell at once, not a round later
TELL_FROM_S = 60.0   # a run whose rest takes less is not worth a line
HINT_FROM_S = 3600.0  # a CPU run of an hour or more gets the hint


def hms(seconds: float) -> str:
    """3725 -> '1h02m', 125 -> '2m05s', 9.5 -> '9.5s'."""
    s = int(round(seconds))
    if seconds < 60:
        return f"{seconds:.1f}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass
class Estimate:
    left: float  # seconds for the rounds left
    rounds_left: int
    per_round: float  # mean seconds per round left, evaluation included
    train: float  # seconds per round without evaluation
    evaluation: float | None  # seconds per evaluation, None: none timed yet
    eval_every: int

    def line(self) -> str:
        ev = ("evaluation not timed yet" if self.evaluation is None else
              f"evaluation {self.evaluation:.2f} s every "
              f"{'round' if self.eval_every == 1 else f'{self.eval_every} rounds'}")
        return (f"estimated time: {self.per_round:.2f} s/round x {self.rounds_left} rounds left = {hms(self.left)} "
                f"(training {self.train:.2f} s/round, {ev})")

    def hint(self, device_type: str) -> str | None:
        """For hours on the CPU: a GPU, or evaluating less often, shortens the run."""
        if device_type != "cpu" or self.left < HINT_FROM_S:
            return None
        share = "" if self.evaluation is None else \
            f"; evaluation is {self.evaluation / self.eval_every / self.per_round:.0%} of the time now"
        return (f"hint: this run takes hours on the CPU; a GPU (device=cuda) or evaluating less often "
                f"(e.g. eval_every=10{share}) shortens it")


@dataclass
class RoundClock:
    """Seconds of the rounds run in this process, and the estimate for the rest of the schedule."""

    rounds: int  # the schedule's last round
    eval_every: int
    train: list[float] = field(default_factory=list)  # per timed round: without its evaluation
    evals: list[float] = field(default_factory=list)  # per timed evaluation
    last_round: int = 0
    told: bool = False

    def tick(self, rnd: int, seconds: float, eval_seconds: float = 0.0) -> None:
        """Round `rnd` took `seconds`, `eval_seconds` of them evaluating (0: not evaluated)."""
        self.train.append(seconds - eval_seconds)
        if eval_seconds:
            self.evals.append(eval_seconds)
        self.last_round = rnd

    def evaluations_after(self, rnd: int) -> int:
        """Evaluations in rounds rnd+1..rounds: every eval_every-th round and the last."""
        if rnd >= self.rounds:
            return 0
        return self.rounds // self.eval_every - rnd // self.eval_every + (self.rounds % self.eval_every != 0)

    def estimate(self) -> Estimate | None:
        """The rest's estimate once measured: after two rounds (the first carries one-time costs, so it
        is left out then), or after one that took LONG_ROUND_S; None before, or when none are left."""
        n = len(self.train)
        if n == 0 or (n == 1 and self.train[0] + sum(self.evals) < LONG_ROUND_S):
            return None
        left_rounds = self.rounds - self.last_round
        if left_rounds <= 0:
            return None
        train = self.train[1:] if n > 1 else self.train
        t = sum(train) / len(train)
        ev = self.evals[1:] if len(self.evals) > 1 else self.evals
        e = sum(ev) / len(ev) if ev else None
        left = left_rounds * t + self.evaluations_after(self.last_round) * (e or 0.0)
        return Estimate(left, left_rounds, left / left_rounds, t, e, self.eval_every)

    def tell(self, device_type: str) -> list[str]:
        """The lines to print, once: the estimate (when the rest takes TELL_FROM_S or more) and the hint."""
        if self.told:
            return []
        est = self.estimate()
        if est is None:
            return []
        self.told = True
        if est.left < TELL_FROM_S:
            return []
        hint = est.hint(device_type)
        return [est.line(), *([hint] if hint else [])]


class RoundReporter:
    """What the round loop shows as it goes, out of its body (nanoGPT's `log_metrics`): the progress
    bar (tqdm, with `progress`) of rounds `first`+1..`clock.rounds`, its postfix the last evaluated
    accuracies and the time left, and the estimate's line on stderr once (`RoundClock.tell`). The
    loop calls `on_round` after each round and `close` after the last."""

    def __init__(self, clock: RoundClock, device_type: str, desc: str, first: int, progress: bool):
        self.clock, self.device_type, self.bar = clock, device_type, None
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=clock.rounds, initial=first, desc=desc, unit="round", dynamic_ncols=True)

    def on_round(self, rnd: int, seconds: float, eval_seconds: float, row: dict | None) -> None:
        """Round `rnd` took `seconds`, `eval_seconds` of them evaluating; `row`: the metrics of the
        last evaluation of the run the bar follows (None: none yet)."""
        clock, bar = self.clock, self.bar
        clock.tick(rnd, seconds, eval_seconds)
        for line in clock.tell(self.device_type):
            (bar.write if bar is not None else print)(f"fedrun: {line}", file=sys.stderr)
        if bar is None:
            return
        if row is not None and (rnd % clock.eval_every == 0 or rnd == clock.rounds):
            post = {"global": f"{row['global_acc']:.4f}"}
            if "pers_acc" in row:
                post["pers"] = f"{row['pers_acc']:.4f}"
            est = clock.estimate()
            if est is not None:  # s/round x rounds, where tqdm's own rate smooths over recent rounds
                post["est"] = f"{est.per_round:.2f}s x {est.rounds_left} = {hms(est.left)}"
            bar.set_postfix(post, refresh=False)
        bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

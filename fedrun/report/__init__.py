"""`fedrun-report DIR [DIR ...]`: one table and one figure from the runs of a sweep.

Finds every job under the given folders (a folder holding `.hydra/config.yaml`, as Hydra writes for
each run and for each job of a multirun), groups the jobs by configuration (the job's composed
config with the seed and the options that do not change the numbers left out), and writes next to
the runs (or into --out):

- `summary.csv`: one row per configuration; mean and std over seeds of the last-round and of the
  best-round accuracy, of the lowest and highest client accuracy of the last round and of the best
  round, and of the rounds and of the models transmitted (metrics.csv `models_transmitted` at that
  round) needed to reach each --target accuracy, for the global and the personalized models; with
  --baseline, the gain of every configuration over it: baseline's transmissions / its own (paper
  004, Tables 1-2);
- `summary.md`: the same as a Markdown table (percent), followed by the jobs left out;
- `summary.png`: mean accuracy curves over seeds with +- std bands, one line per configuration;
- `jobs.csv`: every job found, its configuration, seed and status.

All numbers come from each job's `metrics.csv`. A job is left out, and listed with its reason,
when it failed (its `error.txt`), has no `summary.json` (killed or still running), its summary says
it did not finish (`diverged`), its `metrics.csv` has fewer rows than its `rounds` and `eval_every`
promise, a round that is not a number or a non-finite accuracy, or a file of it cannot be read
(not UTF-8, corrupt YAML, another application's folder). Jobs that never started are listed too.
Std is the sample standard deviation (ddof=1); it is empty for a configuration with one seed.
"""
from __future__ import annotations

import argparse
import os
import sys

from ..args import ArgumentParser
from ..config import FIGURE_FORMATS
from .jobs import (  # noqa: F401
    GROUPS,
    MODEL_NAMES,
    NEUTRAL_KEYS,
    PREFIXES,
    Group,
    Job,
    expected_rows,
    find_job_dirs,
    group_jobs,
    load_job,
    missing_job_numbers,
    missing_jobs,
    sweep_jobs,
    torn_row,
)
from .markdown import _not_reached, _pm, gain_cell, markdown  # noqa: F401
from .stats import (  # noqa: F401
    add_gains,
    find_baseline,
    gain,
    job_values,
    mean_curve,
    rounds_to_reach,
    seed_stats,
    summarize,
    target_name,
    transmitted_to_reach,
)
from .write import Report, build, write_report  # noqa: F401


def parse_targets(values: list[str], option: str = "--target", hint: str = "") -> list[float]:
    """'0.8', '80', '80%' or comma-separated lists of them -> fractions (values above 1 are percent);
    a ValueError naming `option` for a bad one (`hint` appended to a value that is not a number)."""
    out = []
    for v in values:
        for part in str(v).split(","):
            part = part.strip().rstrip("%")
            if not part:
                continue
            try:
                t = float(part)
            except ValueError:
                raise ValueError(f"{option} {part!r} is not a number{hint}") from None
            t = t / 100 if t > 1 else t
            if not 0 < t <= 1:
                raise ValueError(f"{option} {part!r} must be an accuracy in (0, 1] or a percent in (1, 100]")
            out.append(t)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="fedrun-report", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="e.g. fedrun-report outputs/multirun/2026-01-01_12-00-00 --target 80 90 "
                                        "--baseline perfedavg")
    ap.add_argument("dirs", nargs="+", help="multirun folder(s) or run folders; searched recursively for jobs")
    ap.add_argument("--target", nargs="+", default=[], metavar="ACC",
                    help="accuracies for 'rounds to reach' (0.8, 80 or 80%%; lists allowed: 80,90)")
    ap.add_argument("--baseline", default=None, metavar="CONFIG",
                    help="gain vs this configuration (its label in summary.md, or the preset / algo it ran): its "
                         "models transmitted to reach each --target / each configuration's (paper 004, Tables 1-2)")
    ap.add_argument("--out", default=None, help="folder for summary.csv/.md/.png and jobs.csv (default: the first DIR)")
    ap.add_argument("--no-figure", action="store_true", help="skip summary.png")
    ap.add_argument("--format", default="png", choices=FIGURE_FORMATS, help="the summary figure's file type")
    args = ap.parse_args(argv)
    for d in args.dirs:
        if not os.path.isdir(d):
            print(f"fedrun-report: error: {d} is not a folder", file=sys.stderr)
            return 2
    try:
        targets = parse_targets(args.target, hint=" (give the folders before --target)")
        rep = write_report(args.dirs, args.out, targets, figure=not args.no_figure, baseline=args.baseline,
                           plot_format=args.format)
    except (ValueError, FileNotFoundError) as e:
        print(f"fedrun-report: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a read-only or full disk, a file named as the folder
        from ..outputs import cannot_write

        out = args.out or args.dirs[0]
        print(f"fedrun-report: error: --out {out}: {cannot_write(e, 'name a writable folder with --out')}",
              file=sys.stderr)
        return 2
    n_ok = sum(j.ok for j in rep.jobs)
    more = " (and jobs without a record: see 'missing' below)" if rep.missing else ""
    print(f"fedrun-report: {len(rep.jobs)} jobs, {n_ok} finished, {len(rep.groups)} configurations{more}")
    for j in rep.left_out:
        print(f"fedrun-report: left out {j.path}: {j.status}")
    for m in rep.missing:
        print(f"fedrun-report: missing: {m}")
    for name, path in rep.files.items():
        print(f"fedrun-report: wrote {path}")
    return 0


def _console() -> None:
    sys.exit(main())


if __name__ == "__main__":
    _console()

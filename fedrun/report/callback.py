"""The summary table at the end of `fedrun -m`: a Hydra callback (conf/config.yaml,
`hydra.callbacks.sweep_report`) that runs `fedrun-report` on the sweep folder once every job is done,
writes summary.csv / .md / .png and jobs.csv there and prints the table. `~hydra.callbacks.sweep_report`
on the command line turns it off (the paper scripts do: they write their own report).

It runs only when the sweep gets to its end: a job that fails (a bad option, a crash, divergence
with `on_diverge=stop`) stops the sweep before it, and `fedrun-report <sweep folder>` then reports
what finished. A report that cannot be made prints one line and leaves the sweep's exit status and
its job folders alone. `plot=false` leaves out summary.png too.
"""
from __future__ import annotations

import sys

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class SweepReport(Callback):
    def __init__(self, figure: bool = True) -> None:
        self.figure = figure

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from . import write_report

        sweep_dir = config.hydra.sweep.dir
        try:
            rep = write_report([sweep_dir], figure=self.figure and bool(config.get("plot", True)),
                               plot_format=config.get("plot_format", "png"))
        except Exception as e:  # noqa: BLE001 - the sweep itself is done; its report is a courtesy
            print(f"fedrun: no sweep summary for {sweep_dir}: {e}", file=sys.stderr)
            return
        with open(rep.files["summary.md"], encoding="utf-8") as f:
            table = [line.rstrip("\n") for line in f if line.startswith("|")]
        n_ok = sum(j.ok for j in rep.jobs)
        print(f"fedrun: sweep summary ({len(rep.jobs)} jobs, {n_ok} finished, {len(rep.groups)} configurations; "
              f"accuracy in %, mean ± std over seeds):")
        print("\n".join(table))
        for j in rep.left_out:
            print(f"fedrun: left out of the summary: {j.path}: {j.status}")
        for m in rep.missing:
            print(f"fedrun: missing from the summary: {m}")
        print(f"fedrun: wrote {', '.join(sorted(rep.files))} in {sweep_dir} (redo with: fedrun-report {sweep_dir})")

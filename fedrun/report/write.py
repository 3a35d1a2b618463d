"""Builds a report from run folders and writes summary.csv / .md / .png and jobs.csv."""
from __future__ import annotations

import os
from dataclasses import dataclass

import pandas as pd

from .jobs import Group, Job, find_job_dirs, group_jobs, load_job, missing_jobs
from .markdown import markdown
from .stats import add_gains, find_baseline, summarize


@dataclass
class Report:
    jobs: list[Job]
    groups: list[Group]
    table: pd.DataFrame
    left_out: list[Job]
    missing: list[str]
    files: dict


def build(roots: list[str], targets: list[float] | None = None,
          baseline: str | None = None) -> tuple[list[Job], list[Group], pd.DataFrame]:
    """Jobs, configurations and the summary table; with `baseline` (a label, preset or algo name,
    see `find_baseline`) the table gains the gain columns of `add_gains`."""
    jobs = [load_job(p) for p in find_job_dirs(roots)]
    groups = group_jobs(jobs)
    targets = list(targets or [])
    table = summarize(groups, targets)
    if baseline is not None and groups:
        table = add_gains(table, find_baseline(groups, baseline).label, targets)
    return jobs, groups, table


def write_report(roots: list[str], out_dir: str | None = None, targets: list[float] | None = None,
                 figure: bool = True, title: str | None = None, baseline: str | None = None,
                 plot_format: str = "png") -> Report:
    from .. import outputs

    targets = list(targets or [])
    out_dir = out_dir or roots[0]
    if baseline is not None and not targets:
        raise ValueError("--baseline needs at least one --target (the gain is in transmissions to reach it)")
    jobs, groups, table = build(roots, targets, baseline)
    if not jobs:
        raise FileNotFoundError(f"no runs under {', '.join(roots)} (looked for <job>/.hydra/config.yaml)")
    left_out = [j for j in jobs if not j.ok]
    missing = missing_jobs(jobs, roots)
    os.makedirs(out_dir, exist_ok=True)
    files = {}
    if len(table):
        files["summary.csv"] = os.path.join(out_dir, "summary.csv")
        table.to_csv(files["summary.csv"] + ".tmp", index=False)
        os.replace(files["summary.csv"] + ".tmp", files["summary.csv"])
    title = title or f"fedrun report: {', '.join(os.path.basename(os.path.abspath(r)) for r in roots)}"
    files["summary.md"] = os.path.join(out_dir, "summary.md")
    outputs.write_atomic(files["summary.md"], markdown(table, left_out, missing, targets, title) if len(table) else
                         markdown(pd.DataFrame(columns=["config"]), left_out, missing, [], title))
    files["jobs.csv"] = os.path.join(out_dir, "jobs.csv")
    outputs.write_csv(files["jobs.csv"], [
        {"job": os.path.relpath(j.path, out_dir), "num": j.num, "seed": j.seed, "config": j.label,
         "status": j.status, "rows": None if j.metrics is None else len(j.metrics)} for j in jobs])
    if figure and groups:
        from .figure import summary_figure

        files[f"summary.{plot_format}"] = os.path.join(out_dir, f"summary.{plot_format}")
        summary_figure(groups, files[f"summary.{plot_format}"])
    return Report(jobs, groups, table, left_out, missing, files)

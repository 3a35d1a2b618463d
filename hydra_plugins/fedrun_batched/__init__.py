"""`hydra/launcher=batched`: a sweep's jobs that differ only in `seed` run as ONE computation.

    fedrun -m experiment=pfedme_synthetic_dnn_pfedme protocol=official seed=0,1,2,3,4 hydra/launcher=batched

Hydra finds launchers in the `hydra_plugins` namespace package; this one ships with fedrun. Every
job gets its folder as under the basic launcher (Hydra's `run_job` makes it; the job writes its
`.hydra/` files once it starts, as a single run does: `fedrun.run.folder.hydra_record`), then
`fedrun.run.runner.run_jobs` trains the jobs: those equal but for `seed` together (every seed's
states and random streams stacked along the client dimension), at most `max_group` seeds at a time
(null: all), and the others one after the other, as the basic launcher would. It runs fedrun jobs
only: the task function Hydra hands it (fedrun's `run_jobs` of one job) is not called. A job's
`hydra.job.env_set` is in the environment while it trains, as under the basic launcher.
"""

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, env_override, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)


@dataclass
class BatchedLauncherConf:
    _target_: str = "hydra_plugins.fedrun_batched.BatchedLauncher"
    max_group: Optional[int] = None  # most seeds trained together (null: all of a configuration's)


ConfigStore.instance().store(group="hydra/launcher", name="batched", node=BatchedLauncherConf, provider="fedrun")


class BatchedLauncher(Launcher):
    def __init__(self, max_group: Optional[int] = None) -> None:
        super().__init__()
        if max_group is not None and (not isinstance(max_group, int) or isinstance(max_group, bool) or max_group < 1):
            raise ValueError(f"hydra.launcher.max_group={max_group!r} must be an integer >= 1 or null")
        self.max_group = max_group
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from fedrun.run.folder import hydra_record
        from fedrun.run.runner import keep_failure, report, run_jobs

        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        log.info(f"Launching {len(job_overrides)} jobs locally, seeds of one configuration batched")
        # 1. Hydra's per-job setup (folder, .hydra/ files, job config), the job itself deferred.
        jobs: list[tuple[DictConfig, str]] = []
        envs: list[dict] = []  # each job's hydra.job.env_set, applied while it trains (as run_job does)
        rets: list[JobReturn] = []
        for idx, overrides in enumerate(job_overrides):
            idx = initial_job_idx + idx
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = idx
                sweep_config.hydra.job.num = idx

            def defer(cfg: DictConfig) -> None:
                jobs.append((cfg, HydraConfig.get().runtime.output_dir, hydra_record(cfg)))
                envs.append({str(k): str(v) for k, v in HydraConfig.get().job.env_set.items()})

            rets.append(run_job(hydra_context=self.hydra_context, task_function=defer, config=sweep_config,
                                job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir"))
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        # 2. The jobs themselves, grouped (jobs with different env_set never share a group);
        # 3. each job's ending as fedrun reports a single run's.
        by_env: dict[tuple, list[int]] = {}
        for i, env in enumerate(envs):
            by_env.setdefault(tuple(sorted(env.items())), []).append(i)
        results: list = [None] * len(jobs)
        for env, mine in by_env.items():
            with env_override(dict(env)):
                me = f"{type(self).__module__}.{type(self).__qualname__}"  # threads=auto: one per job
                for i, res in zip(mine, run_jobs([jobs[i] for i in mine], self.max_group, me)):
                    results[i] = res
        for (_, out_dir, record), result in zip(jobs, results):  # every failed job keeps why, before the exit
            if isinstance(result, Exception):
                keep_failure(out_dir, result, record)
        for ret, (_, out_dir, record), result in zip(rets, jobs, results):
            ret.return_value = report(result, out_dir, record)  # exits on a failed job, as a single run does
            ret.status = JobStatus.COMPLETED
        return rets

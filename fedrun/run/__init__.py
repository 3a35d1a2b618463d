"""The run wing: from a composed config to a checked spec to a running job and its folder.

spec.py (`RunSpec.from_config`: the one pass over a run's options, holding the algorithm, data and
model it built), checks.py (`precheck` of the command line, `job_problems` of a sweep's job),
runner.py (`Job(spec, folder)`, `run_jobs`: one job or a group of seeds, its signals and exit status),
folder.py (what a run writes), resume.py (a checkpoint's fingerprint and finding it), protocol.py
(protocol=), memory.py (memory=), acceleration.py (compile=, precision=), trackers.py (logger=).
The round loop below (fedrun.simulate) never sees the config.
"""

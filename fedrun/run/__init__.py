"""The run wing: from a composed config to a running job and its folder.

checks.py (`precheck` of the command line, `validate`, `job_problems`), protocol.py (protocol=),
resume.py (a checkpoint's fingerprint and finding it), memory.py (memory=), acceleration.py
(compile=, precision=), trackers.py (logger=), folder.py (what a run writes) and runner.py (one job,
or a group of seeds, its signals and exit status). The round loop below (fedrun.simulate) never sees
the config.
"""

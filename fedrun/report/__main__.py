"""`python -m fedrun.report DIR ...` (the same as `fedrun-report`)."""
from . import _console

_console()

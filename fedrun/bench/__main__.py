"""`python -m fedrun.bench`: the same as `fedrun-bench`."""
from .cli import main

main()

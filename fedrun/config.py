"""Where fedrun's configs live and how they are grouped (read by the CLI, validation and the report)."""
from __future__ import annotations

import os

CONF_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")
GROUPS = ("algo", "data", "model")
PRESETS = "experiment"  # conf/experiment: paper presets that override groups and top-level options

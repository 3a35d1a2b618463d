"""Where fedrun's configs live and how they are grouped (read by the CLI, validation and the report)."""
from __future__ import annotations

import os

from omegaconf import OmegaConf

CONF_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")
GROUPS = ("algo", "data", "model")
PRESETS = "experiment"  # conf/experiment: paper presets that override groups and top-level options

# Options that do not change a run's numbers, as dotted paths of the composed config. They are
# never part of a configuration's identity: the resume fingerprint, fedrun-report's grouping,
# Hydra's job folder names (conf/config.yaml interpolates `${fedrun.neutral:seed}`) and the paper
# scripts all read this one list. `seed` is not in it (it changes the numbers; where seeds are
# grouped or hidden, the caller adds it). `device` and `engine` give the same numbers within float
# tolerance (checked by the engine-agreement tests), `max_chunks`, `client_chunk` and `data.chunk_len`
# only split the same sums differently; the rest are where files live, what is printed or drawn,
# and what happens on failure or restart.
NEUTRAL_OPTIONS = (
    "device", "engine", "max_chunks", "client_chunk", "progress", "plot", "checkpoint_every", "resume", "on_diverge",
    "cache_dir", "data.cache_dir", "data.root", "data.download", "data.chunk_len",
)


def neutral_options(*extra: str) -> list[str]:
    """NEUTRAL_OPTIONS after `extra` (e.g. "seed"): the resolver `${fedrun.neutral:seed}` of conf/config.yaml."""
    return [*extra, *(o for o in NEUTRAL_OPTIONS if o not in extra)]


def drop_options(tree: dict, options) -> dict:
    """A copy of the nested dict `tree` without the dotted paths in `options`."""
    out = {}
    for k, v in tree.items():
        if k in options:
            continue
        inner = [o[len(k) + 1:] for o in options if o.startswith(f"{k}.")]
        out[k] = drop_options(v, inner) if isinstance(v, dict) and inner else v
    return out


OmegaConf.register_new_resolver("fedrun.neutral", neutral_options, replace=True)

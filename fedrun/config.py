"""Where fedrun's configs live and how they are grouped (read by the CLI, validation and the report)."""
from __future__ import annotations

import copy
import os

import yaml
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError, DataMissingError
from .hydra_compat import omegaconf_yaml_loader


def _conf_dir() -> str:
    """The shipped configs: `fedrun/conf` in an installed package (the wheel carries the repository's
    top-level conf/ as package data, see setup.py), else `conf/` beside the package in a checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (os.path.join(here, "conf"), os.path.join(os.path.dirname(here), "conf")):
        if os.path.isfile(os.path.join(d, "config.yaml")):
            return d
    raise FileNotFoundError(f"fedrun's configs (config.yaml) are neither in {here}/conf nor beside {here}")


CONF_DIR = _conf_dir()
FIGURE_FORMATS = ("png", "pdf", "svg")  # `plot_format`: the file type of every figure fedrun draws
GROUPS = ("algo", "data", "dataset", "partition", "model")
PRESETS = "experiment"  # conf/experiment: paper presets that override groups and top-level options


def search_roots(argv: list[str] | None = None) -> list[str]:
    """Config folders in Hydra's order: the shipped ones first, then the user's, from a
    `hydra.searchpath=[file://DIR,pkg://module]` argument (DIR relative to the current folder)."""
    import importlib.util

    roots = [CONF_DIR]
    for arg in argv or []:
        key, _, value = arg.partition("=")
        if key.lstrip("+") != "hydra.searchpath":
            continue
        for entry in value.strip().strip("[]").split(","):
            entry = entry.strip().strip("'\"")
            if entry.startswith("file://"):
                roots.append(os.path.abspath(entry[len("file://"):]))
            elif entry.startswith("pkg://"):
                spec = importlib.util.find_spec(entry[len("pkg://"):])
                roots += list(spec.submodule_search_locations or []) if spec else []
    return roots


def with_env_searchpath(argv: list[str], env: dict | None = None) -> list[str]:
    """`argv` plus `hydra.searchpath=[file://DIR,...]` from $FEDRUN_CONF_PATH (folders separated by
    os.pathsep), unless `argv` sets hydra.searchpath itself (the command line wins)."""
    value = (os.environ if env is None else env).get("FEDRUN_CONF_PATH", "")
    dirs = [d for d in value.split(os.pathsep) if d]
    if not dirs or any(a.partition("=")[0].lstrip("+") == "hydra.searchpath" for a in argv):
        return list(argv)
    return [*argv, f"hydra.searchpath=[{','.join('file://' + os.path.abspath(d) for d in dirs)}]"]


def with_dataset_root(argv: list[str]) -> list[str]:
    """`argv` with `dataset.root=DIR` given as `data.root=DIR` when the data comes from a `data=` preset
    (the papers' splits: no `dataset=` or `partition=`), so that `dataset.root` (default $FEDRUN_DATA,
    else ./data) says where data is on every route; `data.root` stays as the presets' own name.
    Unchanged when a `dataset=`/`partition=` is chosen (composed data reads dataset.root itself) or
    when a data preset of the command reads no files (data=synthetic: precheck says what is wrong)."""
    def key(arg: str) -> str:
        return arg.partition("=")[0].lstrip("+~") if "=" in arg and not arg.startswith("-") else ""

    keys = [key(a) for a in argv]
    if "dataset.root" not in keys or any(k.split(".")[0] in ("dataset", "partition") and k != "dataset.root"
                                         for k in keys):
        return list(argv)
    roots = search_roots(argv)
    top = load_conf(os.path.join(CONF_DIR, "config.yaml"))
    chosen = next((str(d["data"]) for d in top.defaults if not isinstance(d, str) and "data" in d), None)
    for arg, k in zip(argv, keys):
        if k == PRESETS and arg.partition("=")[2]:
            for d in load_conf(group_file(PRESETS, arg.partition("=")[2].split(",")[0], roots)).get("defaults", []):
                for g, v in (d.items() if not isinstance(d, str) else []):
                    if g.replace("override", "").strip(" /") == "data":  # the preset's data= (before the command's)
                        chosen = str(v)
    choices = next((a.partition("=")[2].split(",") for a, k in zip(argv, keys) if k == "data"), [chosen])
    try:
        if not all("root" in load_conf(group_file("data", c, roots)) for c in choices):
            return list(argv)
    except FileNotFoundError:  # an unknown data= choice: precheck names it
        return list(argv)
    out = []
    for a, k in zip(argv, keys):
        if k == "dataset.root":
            a = "data.root=" + a.partition("=")[2]
        elif k == "hydra.job.config.override_dirname.exclude_keys":
            # job folder names that leave dataset.root out leave out the data.root it became too
            names = [n.strip() for n in a.partition("=")[2].strip().strip("[]").split(",")]
            if "dataset.root" in names and "data.root" not in names:
                a = f"{a.partition('=')[0]}=[{','.join([*names, 'data.root'])}]"
        out.append(a)
    return out


def import_problem(target: str, key: str = "") -> str | None:
    """One line saying why the `_target_` `target` (module.name) cannot be imported, else None: the
    module not on Python's search path (which folders that is, and the fix), a module it needs
    missing, its import failing, or the name not in it. `key` names the option (e.g. `algo`)."""
    import importlib
    import sys

    module, _, name = str(target).rpartition(".")
    where = f"{key}._target_={target!r}" if key else f"_target_={target!r}"
    if not module:
        return f"{where} must be module.name (a class or function of an importable module)"
    try:
        found = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and (module == e.name or module.startswith(e.name + ".")):
            prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix}
            folders = [os.path.abspath(p or ".") for p in sys.path
                       if os.path.isdir(p or ".") and not any(p.startswith(x) for x in prefixes if p)]
            return (f"{where}: no module {module!r} in Python's search path (besides installed packages: "
                    f"{', '.join(folders) or 'no folder'}); add the folder that holds {module.replace('.', '/')}.py "
                    f"to PYTHONPATH (e.g. `PYTHONPATH=. fedrun ...` from that folder) or pip install it")
        return f"{where}: module {module!r} imports {e.name!r}, which is not installed (pip install it)"
    except Exception as e:  # noqa: BLE001 - whatever the user's module raises while it is imported
        first = (str(e).strip().splitlines() or [""])[0][:200]
        return f"{where}: importing module {module!r} ({_found_file(module)}) raised {type(e).__name__}: {first}"
    if not hasattr(found, name):
        return f"{where}: module {module!r} ({getattr(found, '__file__', None) or module}) has no {name!r}"
    return None


def _found_file(module: str) -> str:
    """Where `module` is found (its file), or its name when it is not."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except Exception:  # noqa: BLE001 - a parent package that fails to import
        spec = None
    return spec.origin if spec and spec.origin else module


def group_options(group: str, roots: list[str] | None = None) -> list[str]:
    """The options of a config group (the yaml files of `group/` in every root), sorted."""
    names = set()
    for root in roots or [CONF_DIR]:
        folder = os.path.join(root, group)
        if os.path.isdir(folder):
            # _x.yaml: included by others
            names |= {f[:-5] for f in os.listdir(folder) if f.endswith(".yaml") and not f.startswith("_")}
    return sorted(names)


def group_file(group: str, name: str, roots: list[str] | None = None) -> str:
    """The yaml of option `name` of `group`: the first root that has it, as Hydra picks it."""
    for root in roots or [CONF_DIR]:
        path = os.path.join(root, group, f"{name}.yaml")
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"{group}/{name}.yaml is in none of {', '.join(roots or [CONF_DIR])}")


def _tracker_options() -> tuple[str, ...]:
    """`logger.<tracker>.<option>` of every conf/logger file (Hydra leaves out of job folder names
    only the exact keys it is given, so `logger` alone would not cover an override of these)."""
    folder = os.path.join(CONF_DIR, "logger")
    out: list[str] = []
    for f in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if f.endswith(".yaml"):
            for name, node in OmegaConf.load(os.path.join(folder, f)).items():
                out += [f"logger.{name}.{k}" for k in node if k != "_target_"]
    return tuple(out)


# Options that do not change a run's numbers, as dotted paths of the composed config. They are
# never part of a configuration's identity: the resume fingerprint, fedrun-report's grouping,
# Hydra's job folder names (conf/config.yaml interpolates `${fedrun.neutral:seed}`) and the paper
# scripts all read this one list. `seed` is not in it (it changes the numbers; where seeds are
# grouped or hidden, the caller adds it). `device` and `engine` give the same numbers within float
# tolerance (checked by the engine-agreement tests), `threads`, `max_chunks`, `client_chunk`, `memory` and
# `data.chunk_len` only split the same sums differently; the rest are where files live, what is
# printed, drawn or sent to trackers (logger), and what happens on failure or restart.
NEUTRAL_OPTIONS = (
    "device", "engine", "threads", "max_chunks", "client_chunk", "memory", "progress", "plot", "plot_format",
    "checkpoint_every", "checkpoint_minutes", "resume", "on_diverge", "cache_dir", "data.cache_dir", "data.root",
    "data.download",
    "data.chunk_len", "logger", *_tracker_options(),
    "dataset.root", "dataset.download", "data.dataset.root", "data.dataset.download",  # data=composed's copies
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


def folder_name(name: str, limit: int = 200) -> str:
    """`name` as one folder name: unchanged up to `limit` bytes (file systems allow 255 per name),
    else its first characters, '~' and 12 hex digits of its sha256 (so distinct names stay distinct).
    A sweep job's folder is `<num>_<overrides>`, which grows with every swept option."""
    import hashlib

    raw = str(name).encode("utf-8")
    if len(raw) <= limit:
        return str(name)
    head = raw[:limit - 13].decode("utf-8", errors="ignore")
    return f"{head}~{hashlib.sha256(raw).hexdigest()[:12]}"


OmegaConf.register_new_resolver("fedrun.neutral", neutral_options, replace=True)
OmegaConf.register_new_resolver("fedrun.folder", folder_name, replace=True)


def read_yaml(path: str):
    """A YAML file as plain Python values, read as OmegaConf.load reads it (interpolations stay strings,
    as OmegaConf.to_container(..., resolve=False) gives them)."""
    with open(path, encoding="utf-8") as f:
        obj = yaml.load(f, Loader=omegaconf_yaml_loader())
    return {} if obj is None else obj  # an empty file: OmegaConf.load gives an empty config


_CONF_CACHE: dict[str, tuple[tuple[int, int], object]] = {}


def group_conf(group: str, name: str, roots: list[str] | None = None):
    """Option `name` of `group` as Hydra composes it: the same-group files its defaults list names
    (e.g. conf/partition/_split.yaml, the options every partition shares) merged under its own keys,
    without the defaults list."""
    from omegaconf import OmegaConf

    cfg = load_conf(group_file(group, name, roots))
    base = [group_conf(group, d, roots) for d in cfg.get("defaults", [])
            if isinstance(d, str) and d.startswith("_") and d != "_self_"]  # _x.yaml: fedrun's shared nodes
    cfg.pop("defaults", None)
    return OmegaConf.merge(*base, cfg) if base else cfg


def yaml_values(path: str):
    """read_yaml(path), each file parsed once per process while it is unchanged (keyed by its
    modification time and size): the shipped yamls are read again for every job of a sweep. A new
    copy every call, so callers may change theirs; for a reader of a value or two (a `_target_`),
    without the ~1.3 ms of a DictConfig that load_conf makes of it."""
    return copy.deepcopy(_cached_yaml(path))


def _cached_yaml(path: str):
    st = os.stat(path)
    stamp = (st.st_mtime_ns, st.st_size)
    hit = _CONF_CACHE.get(path)
    if hit is None or hit[0] != stamp:
        hit = _CONF_CACHE[path] = (stamp, read_yaml(path))
    return hit[1]


def load_conf(path: str):
    """OmegaConf.load(path), from yaml_values' cache: a new DictConfig every call, so callers may
    change theirs."""
    return OmegaConf.create(_cached_yaml(path))


def instantiate_checked(node: DictConfig, **kwargs):
    """Hydra's instantiate, with a user's bad value or unimportable `_target_` as one ConfigError line."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as e:
        target = node.get("_target_") if isinstance(node, DictConfig) else None
        problem = import_problem(target, node._get_full_key(None) or "") if target else None
        if problem:  # a user's `_target_` that does not import: Hydra's "Error locating target" in one line
            raise ConfigError(problem) from e
        cause = e.__cause__ or e
        while isinstance(cause, InstantiationException) and cause.__cause__:  # a nested node's (data.dataset's)
            cause = cause.__cause__
        if isinstance(cause, (ConfigError, DataMissingError, ValueError, TypeError, RuntimeError)):  # bad values
            # (RuntimeError: torch refusing a layer's arguments, e.g. model.in_channels=-1)
            raise ConfigError(str(cause).splitlines()[0]) from cause
        raise


def instantiate_model(node: DictConfig, data):
    """The model of `node` (conf/model) for `data` (a FederatedData): its in_features and num_classes,
    and, where `model.vocab_size` is left to follow the dataset's (its `${...dataset.vocab_size}`
    default), the number of token ids the rows use, `data.vocab_size` (a text dataset's vocabulary,
    capped at its training rows' distinct tokens: fedrun.data.datasets.agnews)."""
    extra = {}
    vocab = getattr(data, "vocab_size", None)
    if vocab is not None and follows_dataset_vocab(node):
        extra["vocab_size"] = vocab
    return instantiate_checked(node, in_features=data.in_features, num_classes=data.num_classes, **extra)


def follows_dataset_vocab(node: DictConfig) -> bool:
    """Whether the model `node` leaves its `vocab_size` to the dataset (its yaml's interpolation)."""
    return "vocab_size" in node and OmegaConf.is_interpolation(node, "vocab_size")

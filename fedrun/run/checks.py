"""Checks of the options before any work starts, each problem as one line naming the option."""
from __future__ import annotations

import os

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from . import acceleration, trackers
from ..algorithms.checks import check_choice
from ..algorithms.optim import local_optim
from ..config import (CONF_DIR, FIGURE_FORMATS, GROUPS, PRESETS, group_conf, group_file, group_options, instantiate_checked,
                     load_conf, search_roots)
from ..device import cpu_threads, physical_memory, resolve_device
from .memory import parse_memory
from ..errors import ConfigError
from ..engine import ENGINES, params_of
from .protocol import apply_protocol
from ..simulate import SAMPLING, Schedule


def _int_option(cfg: DictConfig, key: str, low: int) -> int:
    v = cfg[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise ConfigError(f"{key}={v!r} must be an integer >= {low}")
    return v


def _frac(cfg: DictConfig) -> float | None:
    f = cfg.frac
    if f is not None and (not isinstance(f, (int, float)) or isinstance(f, bool) or not 0 < f <= 1):
        raise ConfigError(f"frac={f!r} must be a fraction in (0, 1] (or null to use clients_per_round)")
    return f


def schedule(cfg: DictConfig, num_clients: int) -> Schedule:
    """The run's schedule from the top-level knobs, each checked with a one-line message."""
    m = _int_option(cfg, "clients_per_round", 1)
    if _frac(cfg) is not None:
        m = max(1, round(cfg.frac * num_clients))
    if m > num_clients:
        raise ConfigError(f"clients_per_round={m} exceeds the {num_clients} clients of the data; allowed: 1..{num_clients}")
    return Schedule(
        rounds=_int_option(cfg, "rounds", 1),
        tau=_int_option(cfg, "tau", 1),
        clients_per_round=m,
        batch_size=_int_option(cfg, "batch_size", 1),
        eval_every=_int_option(cfg, "eval_every", 1),
        personalize_batch=None if cfg.personalize_batch is None else _int_option(cfg, "personalize_batch", 1),
        aggregate=cfg.aggregate or "uniform",
        sampling=cfg.get("sampling") or "replacement",
    )


def _optional_int(cfg: DictConfig, key: str, low: int) -> None:
    if cfg[key] is not None:
        _int_option(cfg, key, low)


def bool_options() -> list[str]:
    """The top-level options conf/config.yaml gives a true/false default: they take only true or false
    (Hydra reads `progress=no` as the string 'no', which Python would count as true)."""
    top = load_conf(os.path.join(CONF_DIR, "config.yaml"))
    return [k for k in top if k not in ("defaults", "hydra") and isinstance(top._get_node(k)._value(), bool)]


def check_round_draws(sched: Schedule, training_clients: int, batches_per_step: int) -> None:
    """One line naming tau when a round's minibatch draws (drawn at once: a float and an int64 index
    per row, [clients, tau, batches, batch_size]) would not fit in a quarter of this machine's memory."""
    per_tau = training_clients * batches_per_step * sched.batch_size * 12
    limit = physical_memory() // 4
    if limit and sched.tau * per_tau > limit:
        raise ConfigError(
            f"tau={sched.tau} with batch_size={sched.batch_size} and {training_clients} training clients draws "
            f"{sched.tau * per_tau / 2**30:.0f} GiB of minibatch indices per round, more than a quarter of this "
            f"machine's {physical_memory() / 2**30:.0f} GiB; allowed: tau <= {max(1, limit // per_tau)}")


def _hidden_is_one_width(target) -> bool:
    """Whether the model class `target` takes `hidden` as one integer (its default is one), not a list."""
    import inspect

    from hydra.utils import get_class

    try:
        default = inspect.signature(get_class(target)).parameters["hidden"].default
    except Exception:  # noqa: BLE001 - an unknown target or no such parameter: the list check stands
        return False
    return isinstance(default, int) and not isinstance(default, bool)


def _model_hidden(cfg: DictConfig) -> str | None:
    """model.hidden: layer widths, each an integer >= 1 (a recurrent model's, e.g. model=lstm: one integer)."""
    if "hidden" not in cfg.model:
        return None
    h = cfg.model.hidden
    if _hidden_is_one_width(cfg.model.get("_target_")):
        if isinstance(h, bool) or not isinstance(h, int) or h < 1:
            return f"model.hidden={h!r} must be an integer >= 1 (units per layer)"
        return None
    widths = list(h) if OmegaConf.is_list(h) else None
    if widths is None or not widths or any(not isinstance(w, int) or isinstance(w, bool) or w < 1 for w in widths):
        shown = OmegaConf.to_container(h) if OmegaConf.is_config(h) else h
        return f"model.hidden={shown!r} must be a list of layer widths, integers >= 1 (e.g. [20] or [80,60])"
    return None


def _cache_dir(cfg: DictConfig) -> list[str]:
    out = []
    for key, v in (("cache_dir", cfg.get("cache_dir")), ("data.cache_dir", cfg.data.get("cache_dir"))):
        if isinstance(v, str) and v and os.path.exists(v) and not os.path.isdir(v):
            out.append(f"{key}={v!r} is a file, not a folder; give a folder for the data cache (or null: no cache)")
            break
    return out


def validate(cfg: DictConfig) -> list[str]:
    """Every problem with the options that can be checked before any work starts, one line each."""
    problems: list[str] = []

    def check(fn, *args) -> None:
        try:
            fn(*args)
        except ConfigError as e:
            problems.append(str(e))

    for key, low in (("rounds", 1), ("tau", 1), ("clients_per_round", 1), ("batch_size", 1), ("eval_every", 1),
                     ("checkpoint_every", 0), ("max_chunks", 1), ("seed", 0)):
        check(_int_option, cfg, key, low)
    for key in ("personalize_batch", "client_chunk"):
        check(_optional_int, cfg, key, 1)
    check(_frac, cfg)
    m = cfg.get("checkpoint_minutes")
    if m is not None and (not isinstance(m, (int, float)) or isinstance(m, bool) or m < 0):
        problems.append(f"checkpoint_minutes={m!r} must be a number of minutes >= 0 (0: checkpoints by rounds only)")
    if cfg.aggregate is not None:
        check(check_choice, "aggregate", cfg.aggregate, ["uniform", "samples"])
    if cfg.get("sampling") is not None:
        check(check_choice, "sampling", cfg.sampling, list(SAMPLING))
    check(check_choice, "engine", cfg.engine, sorted(ENGINES))
    check(check_choice, "on_diverge", cfg.on_diverge, ["stop", "record"])
    check(check_choice, "plot_format", cfg.get("plot_format", "png"), list(FIGURE_FORMATS))
    for key in bool_options():
        if key in cfg and not isinstance(cfg[key], bool):
            problems.append(f"{key}={cfg[key]!r} must be true or false")
    problems += _cache_dir(cfg)
    check(resolve_device, str(cfg.device))
    check(parse_memory, cfg.get("memory", "auto"))
    try:
        device = resolve_device(str(cfg.device))
    except Exception:  # a bad device: said above
        device = None
    if device is not None:
        check(acceleration.check, cfg.get("compile", "none"), cfg.get("precision", "fp32"), device)
    check(cpu_threads, cfg.get("threads", "auto"))
    problems += trackers.check(cfg)
    built = {}

    def build(key: str, node, **kwargs) -> None:
        try:
            built[key] = instantiate_checked(node, **kwargs)
        except ConfigError as e:
            if not isinstance(e.__cause__, RuntimeError):
                raise
            given = ", ".join(f"{key}.{k}={v!r}" for k, v in OmegaConf.to_container(node).items() if k != "_target_")
            raise ConfigError(f"{key} options ({given}) do not build a network: {e}") from None

    check(build, "algo", cfg.algo)
    try:
        optim = local_optim(cfg.get("optim"), cfg.get("rounds", 1))
        if "algo" in built:
            built["algo"].set_optim(optim)
    except ConfigError as e:
        problems.append(str(e))
    hidden = _model_hidden(cfg)
    if hidden:
        problems.append(hidden)
    else:
        check(lambda: build("model", cfg.model, in_features=4, num_classes=2))
    if len(built) == 2:  # the algorithm's own needs of the model (a body, BatchNorm or none), on a tiny one
        check(built["algo"].check_params, params_of(built["model"]))
    return problems


def job_problems(cfg: DictConfig) -> list[str]:
    """validate() of a sweep job's config as Hydra composed it (its hydra node dropped, the protocol
    applied, on a copy): what the job would refuse when it started."""
    import copy

    from omegaconf import open_dict, read_write

    task = copy.deepcopy(cfg)
    with read_write(task), open_dict(task):
        task.pop("hydra", None)
    try:
        apply_protocol(task)
    except ConfigError as e:
        return [str(e)]
    return validate(task)


def check_model_fits(model, data, model_name: str, data_name: str) -> None:
    """One line when `model` cannot take `data`'s rows (e.g. model=cnn on the synthetic vectors),
    naming the models of conf/model that do fit them."""
    import torch

    emb = getattr(model, "embedding", None)  # token / character ids past its table would fail mid-run (IndexError)
    if isinstance(emb, torch.nn.Embedding) and not data.train.x.is_floating_point():
        top = int(max(data.train.x.max(), data.test.x.max()))
        if top >= emb.num_embeddings:
            raise ConfigError(f"model.vocab_size={emb.num_embeddings} is too small for data={data_name}, whose rows hold "
                              f"ids up to {top}; leave it to the dataset (its default follows dataset.vocab_size) "
                              f"or set it >= {top + 1}")
    x = data.train.x[:1].cpu()
    try:  # in eval mode: a BatchNorm layer takes one row and its running statistics stay as they were
        with torch.no_grad():
            model.cpu().eval()(x)
    except RuntimeError as e:
        fits = []
        for name in group_options("model"):
            try:
                with torch.no_grad():
                    instantiate(load_conf(group_file("model", name)), in_features=data.in_features,
                                num_classes=data.num_classes).eval()(x)
                fits.append(name)
            except Exception:  # noqa: BLE001 - any failure means it does not fit
                pass
        raise ConfigError(f"model={model_name} does not fit data={data_name}, whose rows have shape "
                          f"{list(x.shape[1:])} ({str(e).splitlines()[0][:120]}); models that fit it: "
                          f"{', '.join(fits) or 'none'}") from None


def precheck(argv: list[str], complete: bool = True) -> str | None:
    """One-line message for an unknown config group option or key in `argv`, else None.

    Hydra's own messages for these are several lines long; this catches the common typos first.
    `complete=False` (for --help) accepts a dataset= without partition= and the other way round.
    """
    roots = search_roots(argv)
    choices = {g: None for g in (*GROUPS, PRESETS)}
    swept = {}  # every option of a swept group (algo=fedavg,fedbn): a group option must exist in each
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if key == "logger":  # trackers: one or several, logger=[tensorboard,mlflow]
            allowed = group_options(key, roots)
            for v in value.strip("[]").split(","):
                if v and v not in allowed:
                    return f"logger={v!r} is not a known logger; choose one of: {', '.join(allowed)} (several: logger=[a,b])"
        if key in (*GROUPS, PRESETS):
            allowed = group_options(key, roots)
            for v in value.split(","):
                if v not in allowed:
                    return f"{key}={v!r} is not a known {key}; choose one of: {', '.join(allowed)}"
            choices[key] = value.split(",")[0]
            swept[key] = value.split(",")
    if choices[PRESETS]:  # the groups a preset selects count as chosen unless the command line says otherwise
        preset = load_conf(group_file(PRESETS, choices[PRESETS], roots))
        for d in preset.get("defaults", []):
            for k, v in (d.items() if not isinstance(d, str) else []):
                group = k.replace("override", "").strip(" /")
                if group in GROUPS and choices[group] is None:
                    choices[group] = v
    # dataset= and partition= are read by the data configs that interpolate them (conf/data/composed.yaml)
    reads = lambda data: "${dataset}" in open(group_file("data", data, roots)).read()
    if choices["data"] and (choices["dataset"] or choices["partition"]) and not reads(choices["data"]):
        return (f"dataset=/partition= compose their own data and cannot go with data={choices['data']}; drop data= "
                f"(the old data= settings stay as they are)")
    if complete and not choices["dataset"] and (choices["partition"] or (choices["data"] and reads(choices["data"]))):
        return (f"data={choices['data'] or 'composed'} needs dataset=<option>; choose one of: "
                f"{', '.join(group_options('dataset', roots))}")
    top = load_conf(os.path.join(CONF_DIR, "config.yaml"))
    defaults = {list(d)[0]: list(d.values())[0] for d in top.defaults if not isinstance(d, str)}
    for arg in argv:  # +key=value too: fedrun reads no option its configs lack (it would be recorded, not used)
        if arg.startswith(("-", "~")) or "=" not in arg:
            continue
        key = arg.split("=", 1)[0].lstrip("+")
        head, _, rest = key.partition(".")
        if head.split("/")[0] in ("hydra", "logger") or key in (*GROUPS, PRESETS):  # hydra.* options and hydra/launcher=... groups; Hydra checks logger.*
            continue
        if head in GROUPS and rest:
            if not (choices[head] or defaults[head]):
                return f"{key} needs {head}=<option>; choose one of: {', '.join(group_options(head, roots))}"
            for name in swept.get(head) or [choices[head] or defaults[head]]:
                group_cfg = group_conf(head, name, roots)
                if rest.split(".")[0] not in group_cfg:
                    known = sorted(k for k in group_cfg if not str(k).startswith("_"))
                    return f"{key} is not an option of {head}={name}; its options: {', '.join(known)}"
        elif head not in top:
            known = sorted(k for k in top if k not in ("defaults", "hydra"))
            return f"unknown option {key!r}; top-level options: {', '.join(known)}, and groups {', '.join((*GROUPS, PRESETS))}"
    return None

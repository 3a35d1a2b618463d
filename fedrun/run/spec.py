"""A run compiled from its composed config in ONE pass: `RunSpec.from_config(cfg)` checks every option
(all problems at once, one line each, before any work), builds the algorithm, the data and the model
once, and holds them with the schedule, the device and the output settings as frozen values. The job
(fedrun.run.runner.Job) runs a spec and never reads the config; the round loop never sees it either.

The pass, in order: the options (`validate`: each top-level option, the device, memory=, compile=,
the trackers, the algorithm built and its local optimizer set, the model's options), then the data,
the schedule and the checks that need them (the held-out clients, the round's draws, the model fits
the rows, the algorithm's needs of the model, its hooks' state typed: `base.check_typed`).
`job_problems` (fedrun.run.checks) is the options' part on a copy: what a sweep's job would refuse
before its data is loaded.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from ..algorithms.base import Algorithm, RunInfo, check_typed
from ..algorithms.checks import check_choice
from ..algorithms.optim import PLAIN, local_optim
from ..config import (
    CONF_DIR,
    FIGURE_FORMATS,
    follows_dataset_vocab,
    group_file,
    group_options,
    instantiate_checked,
    load_conf,
)
from ..data import FederatedData
from ..device import cpu_threads, physical_memory, resolve_device
from ..engine import ENGINES, params_of
from ..errors import ConfigError
from ..simulate import SAMPLING, Schedule
from . import acceleration, trackers
from .memory import parse_memory
from .protocol import apply_protocol
from .resume import fingerprint


@dataclass(frozen=True)
class DeviceSpec:
    """Where and how the run computes: device=, threads= (None: leave them as they are), engine=,
    max_chunks=, client_chunk=, compile=, precision=, memory= (as given: memory.budget_bytes reads it)."""

    device: torch.device
    threads: int | None
    engine: str
    max_chunks: int
    client_chunk: int | None
    compile: str
    precision: str
    memory: object


@dataclass(frozen=True)
class OutputSpec:
    """What the run writes and shows: its figures, the progress bar, checkpoints (every `checkpoint_every`
    rounds, every `checkpoint_minutes`), where it resumes from (`resume`), what a divergence does, and
    its trackers (built, opened when the run starts)."""

    plot: bool
    plot_format: str
    progress: bool
    checkpoint_every: int
    checkpoint_minutes: float
    resume: object
    on_diverge: str
    trackers: tuple[tuple[str, trackers.Tracker], ...]


@dataclass(frozen=True)
class RunSpec:
    """One checked run: the built algorithm (its local optimizer set), data and model (built once, seeded
    with `seed`; `rng`: the CPU generator's state right after, what the round loop starts from), the
    schedule, device and output settings, the protocol's choices, the checkpoint fingerprint, the
    resolved config (for the trackers), what summary.json says the run was (`identity`) and the data as
    its figures' titles name it (`data_title`)."""

    seed: int
    algo: Algorithm
    data: FederatedData
    model: torch.nn.Module
    rng: torch.Tensor
    model_name: str
    schedule: Schedule
    device: DeviceSpec
    output: OutputSpec
    protocol: str
    protocol_choices: dict
    fingerprint: dict
    config: dict
    identity: dict
    data_title: str

    @classmethod
    def from_config(cls, cfg: DictConfig, data_cache: dict | None = None, launcher: str | None = None) -> RunSpec:
        """Checks and builds the run `cfg` describes; fills, in place, the options its protocol governs.
        Raises ConfigError with every problem of the options (one line each), or the first one the
        data shows. `data_cache`: data already built for an equal `cfg.data` (a group's jobs share
        one). `launcher`: the Hydra launcher's `_target_` (threads=auto), when HydraConfig does not hold it."""
        protocol_choices = apply_protocol(cfg)
        built: dict = {}
        problems = validate(cfg, built)
        if problems:
            raise ConfigError("\n".join(problems))
        algo, tracker_items = built["algo"], built["trackers"]
        if launcher is None and HydraConfig.initialized():
            launcher = HydraConfig.get().launcher.get("_target_")
        device = DeviceSpec(resolve_device(str(cfg.device)), cpu_threads(cfg.get("threads", "auto"), launcher),
                            cfg.engine, cfg.max_chunks, cfg.client_chunk, cfg.get("compile", "none"),
                            cfg.get("precision", "fp32"), cfg.get("memory", "auto"))
        data_key = json.dumps(OmegaConf.to_container(cfg.data, resolve=True), sort_keys=True, default=str)
        cache = {} if data_cache is None else data_cache
        if data_key not in cache:
            cache[data_key] = instantiate_checked(cfg.data)
        data: FederatedData = cache[data_key]
        torch.manual_seed(cfg.seed)  # the model, once: checked here, trained by the job
        model_built: dict = {}
        vocab = getattr(data, "vocab_size", None)  # as config.instantiate_model: a text model's embedding follows it
        extra = {"vocab_size": vocab} if vocab is not None and follows_dataset_vocab(cfg.model) else {}
        problems = model_problems(cfg, algo, model_built, in_features=data.in_features, num_classes=data.num_classes,
                                  **extra)
        if problems:
            raise ConfigError("\n".join(problems))
        model, rng = model_built["model"], torch.get_rng_state()
        sched = schedule(cfg, data.num_train_clients)
        if data.num_holdout and getattr(algo, "train_all", False):
            raise ConfigError("partition.holdout needs an algorithm that trains only sampled clients; "
                              "algo.train_all=true trains every client (set it false or partition.holdout=0)")
        recipe = built["recipe"]  # bound to the run (what its phases are sized by: FedALA's tau), as simulate does
        algo = algo.bind(RunInfo.of(sched, data, recipe.optim, recipe.bn))
        check_typed(algo, params_of(model))  # its state the typed contract's (a user's algorithm returning dicts)
        sizes = data.train.sizes.cpu()[: data.num_train_clients]
        passes = check_passes(algo, sched, sizes)
        check_round_draws(sched, data.num_train_clients if algo.train_all else sched.clients_per_round,
                          algo, int(sizes.max()) // sched.batch_size)
        for line in _warnings(cfg, data, algo, device.device) + passes:
            print(f"fedrun: warning: {line}", file=sys.stderr)
        given = (cfg.get("dataset") or {}).get("vocab_size")
        if data.vocab_size is not None and isinstance(given, int) and data.vocab_size < given \
                and follows_dataset_vocab(cfg.model):
            print(f"fedrun: dataset.vocab_size={given} capped at {data.vocab_size}: the training rows hold "
                  f"{data.vocab_size - 2} distinct tokens (+ padding and unknown); a text model's embedding "
                  f"follows it", file=sys.stderr)
        choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
        model_name = choices.get("model", cfg.model._target_)
        check_model_fits(model, data, model_name, choices.get("data", data.name))  # before any file is written
        model.train()  # as built (the fit is tried in eval mode)
        output = OutputSpec(bool(cfg.plot), cfg.get("plot_format", "png"), cfg.progress, cfg.checkpoint_every,
                            cfg.get("checkpoint_minutes") or 0, cfg.resume, cfg.on_diverge, tuple(tracker_items))
        identity = {"algo": choices.get("algo") or getattr(algo, "name", str(cfg.algo.get("_target_"))),
                    "data": choices.get("data") or data.name,
                    "model": choices.get("model") or str(cfg.model.get("_target_")),
                    "experiment": choices.get("experiment"), "seed": cfg.seed}
        return cls(cfg.seed, algo, data, model, rng, model_name, sched, device, output, cfg.protocol,
                   protocol_choices, fingerprint(cfg), OmegaConf.to_container(cfg, resolve=True), identity,
                   data_title(choices, identity["data"]))


def data_title(choices: dict, data: str) -> str:
    """The data as a figure's title names it: a composed data (`dataset=` x `partition=`) by its
    dataset and partition (`mnist, partition=dirichlet`), not by `composed`; a preset (data=) by its name."""
    if choices.get("dataset"):
        return f"{choices['dataset']}, partition={choices.get('partition') or 'iid'}"
    return data


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
        raise ConfigError(f"clients_per_round={m} exceeds the {num_clients} clients of the data; "
                          f"allowed: 1..{num_clients}")
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


# Bytes a drawn minibatch row takes while a round's draws are made: uniform draws (sampling=replacement)
# a float32 and an int64 index; shuffled ones (sampling=epochs|steps, and a phase of passes) the sort of
# `ClientSplit.shuffled_indices`, about six 4- and 8-byte tensors a row at its peak (measured: 48 bytes a row
# for 10 clients x 23,229 rows x 20 and 60 passes, an epochs phase's blocks too; tests/test_sampling.py holds it
# under this bound).
ROW_BYTES = {"replacement": 12, "shuffled": 64}


def _draw_bytes(algo, sched: Schedule, clients: int, longest: int) -> tuple[int, int]:
    """(bytes of one training round's minibatch draws, the part one more tau step, or one more pass of
    `local_epochs`, adds) for `clients` training clients. A round is tau x the algorithm's
    batches per step, or its phases (`Algorithm.phases` of the bound run, `Algorithm.bind`): steps x batches each,
    or for an `epochs` phase its passes x `longest` minibatches (the most whole minibatches a pass of
    any training client holds: every client's draws are that long, `simulate.sample_phases`)."""
    rows = clients * sched.batch_size
    step = rows * ROW_BYTES["replacement" if sched.sampling == "replacement" else "shuffled"]
    phases = algo.phases()
    if phases is None:
        return sched.tau * algo.batches_per_step * step, algo.batches_per_step * step
    passes = longest * rows * ROW_BYTES["shuffled"]  # one pass of an epochs phase
    total = sum(ph.steps * ph.batches * step if ph.epochs is None else ph.epochs * passes for ph in phases)
    in_passes = getattr(algo, "local_epochs", None) is not None  # else its training phase is tau steps (FedALA's)
    return total, passes if in_passes else step


def check_round_draws(sched: Schedule, training_clients: int, algo, longest: int) -> None:
    """One line naming tau (or algo.local_epochs, for a round in passes over each client's rows) when a
    round's minibatch draws, made at once (`_draw_bytes`), would not fit in a quarter of this machine's
    memory."""
    limit = physical_memory() // 4
    need, unit = _draw_bytes(algo, sched, training_clients, longest)
    if not limit or need <= limit:
        return
    drawn = (f"with batch_size={sched.batch_size} and {training_clients} training clients draws "
             f"{need / 2**30:.0f} GiB of minibatch indices per round")
    over = f"more than a quarter of this machine's {physical_memory() / 2**30:.0f} GiB"
    epochs = getattr(algo, "local_epochs", None)
    if algo.phases() is not None and epochs is not None and longest:
        allowed = max(0, (limit - (need - epochs * unit)) // unit)
        raise ConfigError(f"algo.local_epochs={epochs} {drawn} (passes of up to {longest} minibatches a client), "
                          f"{over}; allowed: algo.local_epochs <= {allowed}")
    raise ConfigError(f"tau={sched.tau} {drawn}, {over}; allowed: tau <= {max(1, limit // unit)}")


def check_passes(algo, sched: Schedule, sizes) -> list[str]:
    """For a round with passes over each client's rows (an `epochs` phase: floor(n_c / batch_size)
    minibatches a pass, the partial one dropped): one line when no training client holds a whole
    minibatch, so nothing trains (ConfigError); a warning (returned) naming how many train no step
    when only some do not (their models go back unchanged)."""
    phases = algo.phases()
    if phases is None or all(ph.epochs is None for ph in phases):
        return []
    B, sizes = sched.batch_size, [int(n) for n in sizes]
    # a step of k disjoint minibatches of one pass (Phase.disjoint: Per-FedAvg's meta-step) needs k x B rows
    k = max(ph.batches if ph.disjoint else 1 for ph in phases if ph.epochs is not None)
    epochs = getattr(algo, "local_epochs", None)
    passes = f"algo={algo.name} runs passes over each client's training rows" + \
        (f" (algo.local_epochs={epochs})" if epochs is not None else "")
    cut = ("floor(rows / batch_size)" if k == 1 else
           f"floor(rows / ({k} x batch_size)) (a step's {k} disjoint minibatches)")
    only = all(ph.epochs is not None for ph in phases)  # no phase of steps: a client without a pass trains nothing
    if max(sizes) < k * B:
        raise ConfigError(f"batch_size={B} is larger than every training client's rows"
                          f"{'' if k == 1 else f' / {k}'} (largest: {max(sizes)}): {passes}, each cut into {cut} = 0 "
                          f"steps, so {'no client trains' if only else 'these passes train nothing'}; "
                          f"allowed: batch_size <= {max(sizes) // k}")
    short = sum(n < k * B for n in sizes)
    if not short:
        return []
    return [f"{short} of {len(sizes)} training clients hold fewer than {'' if k == 1 else f'{k} x '}batch_size={B} "
            f"rows: {passes}, and these take no step of them{' (their models go back unchanged)' if only else ''}; "
            f"batch_size <= {min(sizes) // k} gives every client a step"]


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


def validate(cfg: DictConfig, built: dict | None = None) -> list[str]:
    """Every problem with the options that can be checked before any work starts, one line each.
    `built` (given: filled) gets the algorithm (its local optimizer set) and the trackers; a model on
    tiny rows is built only to check the model's options when the run is refused anyway (`built` not
    given, or another problem): an accepted run builds its model once, for its data (RunSpec)."""
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
    items, tracker_problems = trackers.build(cfg)
    problems += tracker_problems
    given, built = built is not None, {} if built is None else built
    built["trackers"] = items
    try:
        built["algo"] = _build("algo", cfg.algo)
    except ConfigError as e:
        problems.append(str(e))
    try:
        optim = local_optim(cfg.get("optim"), cfg.get("rounds", 1))
    except ConfigError as e:
        problems.append(str(e))
        optim = PLAIN
    # the run's recipe (optim.*, bn=), which `from_config` binds the algorithm to with the data's facts
    built["recipe"] = RunInfo(optim=optim, bn=cfg.get("bn", "averaged"))
    if "algo" in built:
        check(built["algo"].check_run, built["recipe"])
    if "algo" in built and isinstance(cfg.tau, int) and not isinstance(cfg.tau, bool) and cfg.tau >= 1:
        check(built["algo"].check_tau, cfg.tau)  # a part of the method the run's tau would never train
    hidden = _model_hidden(cfg)
    if hidden:
        problems.append(hidden)
    elif not given or problems:
        # a run refused anyway names its model's problems too, on tiny rows; an accepted one builds its
        # model once, for its data (RunSpec.from_config)
        problems += model_problems(cfg, built.get("algo"), {}, in_features=4, num_classes=2)
    return problems


def _build(key: str, node, **kwargs):
    """instantiate_checked(node), its RuntimeError (a network its options cannot make) as one line."""
    try:
        return instantiate_checked(node, **kwargs)
    except ConfigError as e:
        if not isinstance(e.__cause__, RuntimeError):
            raise
        given = ", ".join(f"{key}.{k}={v!r}" for k, v in OmegaConf.to_container(node).items() if k != "_target_")
        raise ConfigError(f"{key} options ({given}) do not build a network: {e}") from None


def model_problems(cfg: DictConfig, algo: Algorithm | None, built: dict, **dims) -> list[str]:
    """The model of `cfg.model` built for rows of `dims` (in_features, num_classes) into `built["model"]`,
    and `algo`'s own needs of it (a body, BatchNorm or none): the problems, one line each."""
    try:
        built["model"] = _build("model", cfg.model, **dims)
    except ConfigError as e:
        return [str(e)]
    try:
        if algo is not None:
            algo.check_params(params_of(built["model"]))
    except ConfigError as e:
        return [str(e)]
    return []


def check_model_fits(model, data, model_name: str, data_name: str) -> None:
    """One line when `model` cannot take `data`'s rows (e.g. model=cnn on the synthetic vectors),
    naming the models of conf/model that do fit them."""
    import torch

    emb = getattr(model, "embedding", None)  # token / character ids past its table would fail mid-run (IndexError)
    if isinstance(emb, torch.nn.Embedding) and not data.train.x.is_floating_point():
        top = int(max(data.train.x.max(), data.test.x.max()))
        if top >= emb.num_embeddings:
            raise ConfigError(f"model.vocab_size={emb.num_embeddings} is too small for data={data_name}, "
                              f"whose rows hold ids up to {top}; leave it to the dataset "
                              f"(its default follows dataset.vocab_size) "
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


def _warnings(cfg: DictConfig, data: FederatedData, algo: Algorithm, device: torch.device) -> list[str]:
    """Settings that run, but likely not as meant (a round in passes over the clients' rows: `check_passes`)."""
    out = [line for line in [acceleration.cpu_note(cfg.get("precision", "fp32"), device)] if line]
    given = ([str(o).lstrip("+").split("=", 1)[0] for o in HydraConfig.get().overrides.task]
             if HydraConfig.initialized() else [])
    if cfg.frac is not None and "clients_per_round" in given:
        out.append(f"frac={cfg.frac} sets the clients per round; clients_per_round={cfg.clients_per_round} is ignored")
    largest = int(data.train.sizes.max())
    phases = algo.phases()
    draws = phases is None or any(ph.epochs is None for ph in phases)  # minibatches drawn as sampling= says
    if cfg.batch_size > largest and draws:
        out.append(f"batch_size={cfg.batch_size} is larger than every client's training rows (largest: {largest}); "
                   f"each minibatch repeats rows")
    return out

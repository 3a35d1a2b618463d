"""How a round's local steps execute: `compile=` and `precision=` (README "Speed on a GPU").

A round's local training is `tau` calls of the algorithm's `client_step` on minibatch rows drawn
up front (fedrun.simulate.sample_round), or, for an algorithm whose round is phases
(Algorithm.phases), each phase's steps with a per-client mask (fedrun.simulate.sample_phases: an
epochs phase runs as many steps as the largest training client needs), so its shapes are the same
every round. Three ways to run it:

  none      eager PyTorch, one kernel launch per operation (the reference)
  default   `torch.compile` of one local step (gather the step's rows, augment, client_step):
            Inductor fuses the step's elementwise work; Dynamo traces through torch.func
  graphs    CUDA only: the round's whole local loop (tau steps) is captured once per shape as a
            CUDA graph and replayed each round, so a round launches one graph instead of
            thousands of kernels (a round of small models is launch-bound: ~10 ms whatever the
            number of clients, H200, issue 37). The inputs are copied into the graph's static
            buffers, the outputs copied out.

Precision of the local steps' forward and backward (evaluation always runs in the data's dtype):
  fp32   as the data (float32; float64 in the agreement tests)
  tf32   CUDA matmuls and convolutions in TF32 (10-bit mantissa products, float32 accumulation)
  bf16   torch.autocast to bfloat16 for forward and backward; parameters, their updates and the
         per-client state stay float32 ("master" weights)

A local step whose rate changes over rounds (`Algorithm.step_uses_round`: algo.lr_decay, every
optim.schedule) replays the same graph in every round: under `graphs` its `rnd` argument is a
`fedrun.algorithms.rates.RoundRates`, which gives each such rate as a tensor that the runner refills
with the round's value before each replay (`RoundRates.at`), as it refills the other static inputs;
one graph per shape serves the whole run. A step that reads its round otherwise (RoundNotCapturable),
or whose capture fails (one that reads a value back to the host), runs eagerly: the reason is printed
once and the run goes on with the same numbers.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Callable

import torch

from ..algorithms.rates import RoundNotCapturable, RoundRates
from ..engine.tree import tree_flatten, tree_leaves, tree_map, tree_unflatten
from ..errors import ConfigError
from ..simulate import local_training, one_step

COMPILE = ("none", "default", "graphs")
PRECISION = ("fp32", "tf32", "bf16")


def check(compile: str, precision: str, device: torch.device | str) -> None:
    """One-line ConfigError for a value outside COMPILE / PRECISION, or graphs off CUDA."""
    if compile not in COMPILE:
        raise ConfigError(f"compile={compile!r} is not allowed; choose one of: {', '.join(COMPILE)}")
    if precision not in PRECISION:
        raise ConfigError(f"precision={precision!r} is not allowed; choose one of: {', '.join(PRECISION)}")
    if compile == "graphs" and torch.device(device).type != "cuda":
        raise ConfigError(f"compile=graphs captures CUDA graphs and needs a CUDA device (device={device}); "
                          f"use compile=default or none on the CPU")
    if precision == "tf32" and torch.device(device).type != "cuda":  # refused, not run as fp32 under tf32's name
        raise ConfigError(f"precision=tf32 has no effect on the CPU (device={device}): TF32 is a mode of CUDA "
                          f"matmuls, so the run would compute fp32 while its record says tf32; use precision=fp32")


BF16_CPU = "Per-FedAvg and pFedMe 2.5x and 4.2x per round in docs/performance.md's CPU sitting"


def cpu_note(precision: str, device: torch.device | str) -> str | None:
    """The warning of a precision that runs on the CPU but slower than fp32 (bf16), else None."""
    if precision == "bf16" and torch.device(device).type == "cpu":
        return (f"precision=bf16 on the CPU is usually slower than fp32 ({BF16_CPU}) and less exact; it is "
                f"meant for CUDA devices (precision=fp32 on the CPU)")
    return None


@contextlib.contextmanager
def precision_scope(precision: str, device: torch.device):
    """The local steps' numeric mode (module docstring); fp32 changes nothing."""
    if precision == "bf16":
        with torch.autocast(device.type, dtype=torch.bfloat16):
            yield
    elif precision == "tf32" and device.type == "cuda":
        old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
    else:
        yield


def _say(line: str) -> None:
    print(f"fedrun: {line}", file=sys.stderr, flush=True)


def graph_key(algo, engine, data, spec, leaves: list) -> tuple:
    """What selects a captured graph: the algorithm, engine and data, and the structure, shapes and
    dtypes of the round's inputs (a round's Local, row indices and augmentation draws). Not the
    round: its rates are inputs of the graph (fedrun.algorithms.rates)."""
    return (id(algo), id(engine), id(data), str(spec),
            tuple((tuple(v.shape), v.dtype) for v in leaves if isinstance(v, torch.Tensor)))


def _one_graph():
    """Dynamo traces `torch.autograd.grad` into the compiled step (`trace_autograd_ops`) instead of breaking the
    graph there: an engine's gradient sits 4-5 calls deep in the step (client_step -> Trainer.value_and_grad ->
    Engine.state_value_and_grad -> VmapEngine.value_and_grad), and a break there re-traced each caller's frame
    up to it (SCAFFOLD's step: 70 frames and 3 graphs -> 1 frame, 1 graph). Compiling a step, CPU seconds on
    the 2-core CPU (torch 2.14): aot_eager SCAFFOLD 7.4 -> 2.3, FedCP 17.9 -> 3.9; Inductor FedCP 83 -> 65,
    pavg 57 -> 47; a compiled round's local steps afterwards (Inductor, the tests' tiny MLP, median CPU ms of 40
    rounds, two sittings) SCAFFOLD 2.6-4.5 -> 1.5-1.8, pavg 5.3-6.2 -> 2.1-3.4, FedCP 4.0-5.9 -> 1.7-2.4. The
    backward's operations are then in the step's graph, traced by AOT autograd; the numbers are eager's
    (tests/test_acceleration.py, every algorithm). A torch without the option breaks as before."""
    if hasattr(torch._dynamo.config, "trace_autograd_ops"):
        return torch._dynamo.config.patch(trace_autograd_ops=True)
    return contextlib.nullcontext()


class LocalSteps:
    """Runs `tau` local steps for a round's clients as `compile=` says (module docstring).

    Called as `fedrun.simulate.local_training` is: (algo, engine, local, data, idx, rnd, aug) -> Local.
    `backend` is torch.compile's (the tests use "aot_eager": Dynamo's capture and AOT autograd
    without Inductor's C++ code generation, which took 30-110 s per step on the 2-core CPU here).
    """

    def __init__(self, compile: str = "none", precision: str = "fp32", backend: str = "inductor"):
        self.compile, self.precision, self.backend = compile, precision, backend
        self._compiled: dict[int, Callable] = {}  # id(algo) -> compiled step
        self._graphs: dict[tuple, tuple] = {}  # shapes -> (graph, static inputs, static outputs)
        self._eager_why: str | None = None  # graphs: why this run fell back to eager (said once)
        self.captures = 0  # graphs captured (gpu-check reports it)

    def __call__(self, algo, engine, local, data, idx, rnd, aug=None):
        device = tree_leaves(idx)[0].device  # (idx: a tensor, or a round of phases' PhaseDraws)
        if self.compile == "graphs" and self._eager_why is None:
            try:
                return self._replay(algo, engine, local, data, idx, rnd, aug)
            except RoundNotCapturable as e:  # (raised by the warm-up run, before any capture)
                self._fall_back(f"algo={algo.name}'s local step changes with the round in a way one captured "
                                f"graph cannot replay ({str(e)[:200]})")
            except Exception as e:  # a step that cannot be captured: the same numbers, eagerly
                self._fall_back(f"algo={algo.name}'s local steps could not be captured as a CUDA graph "
                                f"({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})")
        step = None
        if self.compile == "default":
            step = self._step_fn(algo)
            # A step that does not read the round (a declaration tests/test_acceleration.py checks
            # for every algorithm) gets a fixed one, so the compiled step is not specialized anew
            # for each round; one that does gets it as a symbolic int after its second round.
            rnd = rnd if getattr(algo, "step_uses_round", False) else 0
        with precision_scope(self.precision, device), (_one_graph() if step else contextlib.nullcontext()):
            return local_training(algo, engine, local, data, idx, rnd, aug, step=step)

    def _fall_back(self, why: str) -> None:
        self._eager_why = why
        self._graphs.clear()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        _say(f"compile=graphs: {why}; its local steps run eagerly (same numbers, no graph)")

    def _step_fn(self, algo) -> Callable:
        fn = self._compiled.get(id(algo))
        if fn is None:
            # Dynamo keeps compiled code per function, across torch.compile calls: a run starts from
            # none (else another run's algorithm and engine in this process count toward the
            # recompile limit), and hitting the limit raises instead of running on eagerly unnoticed.
            torch._dynamo.reset()
            torch._dynamo.config.fail_on_recompile_limit_hit = True
            fn = self._compiled[id(algo)] = torch.compile(one_step, backend=self.backend)
        return fn

    def _replay(self, algo, engine, local, data, idx, rnd, aug):
        device = tree_leaves(idx)[0].device
        leaves, spec = tree_flatten((local, idx, aug))
        tensors = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]  # (aug may be None)
        # (augmentation params are drawn on the CPU: a host-to-device copy cannot be captured)
        for i in tensors:
            leaves[i] = leaves[i].to(device, non_blocking=True)
        key = graph_key(algo, engine, data, spec, leaves)
        entry = self._graphs.get(key)
        if entry is None:
            static = list(leaves)
            for i in tensors:
                static[i] = leaves[i].clone()
            rates = RoundRates(device).at(rnd)  # (the round's rates: made by the warm-up run, read by the graph)

            def run():
                s_local, s_idx, s_aug = tree_unflatten(static, spec)
                return local_training(algo, engine, s_local, data, s_idx, rates, s_aug)
            with precision_scope(self.precision, device):
                replay, out = self._capture(run)
            entry = self._graphs[key] = (replay, static, out, rates)
            self.captures += 1
        replay, static, out, rates = entry
        for i in tensors:
            static[i].copy_(leaves[i])
        rates.at(rnd)
        replay()
        return tree_map(torch.clone, out)  # the next replay overwrites the graph's outputs

    @staticmethod
    def _capture(run: Callable) -> tuple[Callable, object]:
        """`run` captured as a CUDA graph: (replay, the graph's output tensors). `run` reads its inputs
        from static tensors that the caller refills before each replay."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture (cuBLAS workspaces, lazy inits)
            run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = run()
        return graph.replay, out

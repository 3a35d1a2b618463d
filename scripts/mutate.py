"""Mutation check: applies plausible one-line bugs, each ALONE, and reports which the tests catch.

    python scripts/mutate.py                      # every mutant against its own tests
    python scripts/mutate.py --only vmap-vag-mean,maml-first-order --tests tests/algorithms
    python scripts/mutate.py --list

Each mutant runs in a temporary copy of the checkout (fedrun/, tests/, conf/, scripts/ and the
project files), with PYTHONPATH pointing the copy's tests at the copy's fedrun; the checkout itself
is never written, so an interrupt (Ctrl-C, SIGTERM) cannot leave a bug behind. A mutant whose line is not
found exactly once is reported as "stale" (the code moved on: update the list). Caught: pytest
exited non-zero; the first failing test is named.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COPY = ["fedrun", "tests", "conf", "scripts", "hydra_plugins", "pyproject.toml", "setup.py", "setup.cfg", "pytest.ini"]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]  # pytest's arguments by default (paths, node ids, -k expressions)
    what: str


AGREE = "tests/algorithms/test_branches_agree.py"
TDEBIAS = "tests/algorithms/test_trainer_debias.py"
EPOCH_TRACES = "tests/test_golden_pfllib.py::test_local_work_in_epochs_replays_pfllib"
FEAT_TRACES = "tests/test_golden_pfllib_feat.py"
PARTS, PAPER, SHARED = ("fedrun/data/partitioners/generic.py", "fedrun/data/partitioners/paper.py",
                        "fedrun/data/partitioners/base.py")
PTESTS = "tests/data/test_partitioners.py"
MUTANTS = [
    # the issue's survivors
    Mutant("vmap-vag-mean", "fedrun/engine/vmap.py",
           "values = vmap(fn)(p, *args)\n            grads = torch.autograd.grad(values.sum(),",
           "values = vmap(fn)(p, *args)\n            grads = torch.autograd.grad(values.mean(),",
           (AGREE, "-k", "cnn and pavg and vmap"), "VmapEngine.value_and_grad: mean instead of sum over clients"),
    Mutant("vmap-grad-autograd-mean", "fedrun/engine/vmap.py",
           "self._losses(p, x, y)\n            grads = torch.autograd.grad(losses.sum(), list(p.values()))",
           "self._losses(p, x, y)\n            grads = torch.autograd.grad(losses.mean(), list(p.values()))",
           (AGREE, "-k", "mlp and fedavg and autograd"), "VmapEngine.grad's autograd path: mean instead of sum"),
    Mutant("vmap-train-grad-mean", "fedrun/engine/vmap.py",
           "(p, b, x, y)\n            grads = torch.autograd.grad(losses.sum(), list(p.values()))",
           "(p, b, x, y)\n            grads = torch.autograd.grad(losses.mean(), list(p.values()))",
           (AGREE, "-k", "mlp_bn and fedbn"), "VmapEngine.train_grad (BatchNorm models): mean instead of sum"),
    Mutant("onestep-lr", "fedrun/algorithms/personalize.py",
           "return one_step_adapt(engine, params, ctx.data.train, lr, batch)",
           "return one_step_adapt(engine, params, ctx.data.train, 2 * lr, batch)",
           ("tests/algorithms/test_personalize_by_value.py",),
           "honest test-time step (FedAvg + update, Per-FedAvg): lr 2 alpha"),
    Mutant("pfedme-pm-extra-round", "fedrun/algorithms/pfedme.py",
           "        for r in range(ctx.tau):\n            local = self.client_step(",
           "        for r in range(ctx.tau + 1):\n            local = self.client_step(",
           ("tests/algorithms/test_personalize_by_value.py",),
           "pFedMe's honest PM: one extra local round (IndexError expected: "
                                                 "the batches hold tau rounds)"),
    Mutant("pfedme-pm-one-round-less", "fedrun/algorithms/pfedme.py",
           "        for r in range(ctx.tau):\n            local = self.client_step(",
           "        for r in range(ctx.tau - 1):\n            local = self.client_step(",
           ("tests/algorithms/test_personalize_by_value.py",), "pFedMe's honest PM: one local round less"),
    Mutant("maml-first-order-ignored", "fedrun/algorithms/adaptation.py",
           "create_graph=not self.first_order)", "create_graph=True)",
           ("tests/algorithms/test_debias.py", "-k", "quadratic"), "MAML's first_order=true ignored"),
    Mutant("maml-test-steps-ignored", "fedrun/algorithms/adaptation.py",
           "for s in range(self.test_steps):", "for s in range(self.inner_steps):",
           ("tests/algorithms/test_debias.py", "-k", "quadratic"), "MAML's test_steps ignored (inner_steps used)"),
    Mutant("exact-hvp-sign", "fedrun/algorithms/perfedavg.py",
           "g2 = axpy(-self.alpha, hv, g2)",
           "g2 = axpy(self.alpha, hv, g2)",
           ("tests/algorithms/test_perfedavg.py", "-k", "quadratic or delta"), "Per-FedAvg exact: HVP sign flipped"),
    Mutant("synthetic-cut-seed", "fedrun/data/datasets/synthetic.py",
           "perm = np.random.default_rng([seed, k, SHUFFLE_STREAM]).permutation(len(y))",
           "perm = np.random.default_rng([seed, k + 1, SHUFFLE_STREAM]).permutation(len(y))",
           ("tests/test_draws_pinned.py",),
           "synthetic train/test cut seeded differently"),
    Mutant("sampling-stream", "fedrun/simulate.py",
           "    g = round_generator(seed, rnd)\n    clients = _round_clients(data, sched, g)\n    shape",
           "    g = round_generator(seed, rnd, stream=3)\n    clients = _round_clients(data, sched, g)\n    shape",
           ("tests/test_draws_pinned.py",), "clients and minibatch rows drawn from another random stream"),
    # a few more
    Mutant("hf-delta-sign", "fedrun/algorithms/perfedavg.py",
           "g2 = {k: g2[k] - self.alpha * (gp[k] - gm[k]) / (2 * self.delta) for k in g2}",
           "g2 = {k: g2[k] + self.alpha * (gp[k] - gm[k]) / (2 * self.delta) for k in g2}",
           ("tests/algorithms/test_perfedavg.py", "-k", "quadratic or delta"),
           "Per-FedAvg hf: finite-difference HVP sign flipped"),
    Mutant("group-drops-a-chunk", "fedrun/engine/vmap.py",
           "            sl = slice(s, s + group)\n", "            sl = slice(s, s + group - 1)\n",
           (AGREE, "-k", "mlp and pfedme and chunks"), "full passes: each group of chunks loses its last chunk"),
    Mutant("vmap-conv-per-client-forward", "fedrun/models/small.py",
           "            h = torch.func.vmap(lambda p, xi: torch.func.functional_call(self.conv, p, (xi,)))(conv, x)",
           "            h = torch.func.vmap(lambda p, xi: torch.func.functional_call(self.conv, p, (xi,)))(conv, "
           "x.flip(0))",
           (AGREE, "-k", "cnn and fedavg and vmap"),
           "CNN.stacked_forward's vmapped (GPU) convolutions: clients' images swapped"),
    Mutant("per-client-sync", "fedrun/simulate.py",
           "    return torch.nonzero(~ok).flatten().tolist() if not bool(ok.all()) else []",
           "    return [i for i in range(len(ok)) if not bool(ok[i])]",
           ("tests/test_host_syncs.py", "-k", "grow"),
           "the divergence guard reads every client's flag from the device"),
    Mutant("cpu-index-in-round", "fedrun/simulate.py",
           "    xb, yb = data.train.rows(idx)\n", "    xb, yb = data.train.rows(idx.cpu())\n",
           ("tests/test_host_syncs.py", "-k", "fake"), "a CPU index tensor mixed into the device's minibatch gather"),
    # paper 004's debiased family against the authors' traces (tests/test_golden_pfl.py, 3 rounds)
    Mutant("feddyn-state-sign", "fedrun/algorithms/pfldyn.py",
           "g_new = axpy(-self.alpha, delta, gather(local.g, selected))",
           "g_new = axpy(self.alpha, delta, gather(local.g, selected))",
           ("tests/test_golden_pfl.py", "-k", "feddyn"), "FedDyn/PFLDyn: g_i update sign flipped"),
    Mutant("scaffold-ci-sign", "fedrun/algorithms/pflscaf.py",
           'ci_new = {k: ci[k] - state.extra["c"][k] + (state.params[k] - w[k]) / per_client(scale',
           'ci_new = {k: ci[k] - state.extra["c"][k] + (w[k] - state.params[k]) / per_client(scale',
           ("tests/test_golden_pfl.py", "-k", "scaffold"), "SCAFFOLD/PFLScaf: c_i update uses w_i - w^t"),
    Mutant("pfl-lr-decay-once", "fedrun/algorithms/debiased.py",
           "return self.lr * self.lr_decay ** (rnd - 1)",
           "return self.lr * self.lr_decay ** min(rnd - 1, 1)",
           ("tests/test_golden_pfl.py", "-k", "feddyn"), "paper-004 lr decay applied once, not compounded "
                                                        "(first wrong number in round 3)"),
    # the debiased family on the local trainer (issue 44): optim.*, BatchNorm
    Mutant("debias-optim-steps-unused", "fedrun/algorithms/debiased.py",
           'out = self.descend(local, "params", g, lr, rnd, names=[k for k in g if k not in skip])',
           'out = self.descend(local, "params", g, lr, rnd, names=list(g))',
           (TDEBIAS, "-k", "unused"), "P-Avg (Proto): optim.* decays/steps the output layer the loss does not use"),
    Mutant("debias-bn-stats-dropped", "fedrun/algorithms/debiased.py",
           'g, _, local = self.value_and_grad(engine, local, "params", meta_loss',
           'g, _, _ = self.value_and_grad(engine, local, "params", meta_loss',
           (TDEBIAS, "-k", "batchnorm and scaffold"), "debiased local step: BatchNorm running statistics not updated"),
    Mutant("scaffold-linear-term-sign", "fedrun/algorithms/pflscaf.py",
           "return sub(local.c, local.ci)  # c - c_i",
           "return sub(local.ci, local.c)  # c - c_i",
           (TDEBIAS, "-k", "batchnorm and scaffold"), "SCAFFOLD/PFLScaf: correction c_i - c instead of c - c_i"),
    Mutant("pfldyn-server-drops-buffers", "fedrun/algorithms/pfldyn.py",
           "params = {**avg, **{k: avg[k] - h[k] / self.alpha for k in h}}",
           "params = {k: avg[k] - h[k] / self.alpha for k in h}",
           (TDEBIAS, "-k", "server and pfldyn"), "FedDyn/PFLDyn's server model loses its BatchNorm statistics"),
    Mutant("debias-wd-pair-allowed", "fedrun/algorithms/debiased.py",
           "if not optim.plain and self.weight_decay and optim.weight_decay:", "if False:",
           (TDEBIAS, "-k", "refused"), "algo.weight_decay with optim.weight_decay taken (decay applied twice)"),
    # the debiased family's typed state (PAvgLocal, PFLScafLocal: the step counter; the Clients' `last`)
    Mutant("pavg-steps-not-counted", "fedrun/algorithms/pavg.py",
           "        return local._replace(steps=local.steps + 1)", "        return local",
           ("tests/test_golden_pfl.py", "-k", "pavg_proto"),
           "P-Avg (Proto): the step counter stays 0, proto_first_step_only embeds with features every step"),
    Mutant("pflscaf-steps-not-counted", "fedrun/algorithms/pflscaf.py",
           "        return local._replace(steps=local.steps + 1)", "        return local",
           ("tests/test_golden_pfl.py", "-k", "scaffold"), "SCAFFOLD/PFLScaf: K = 0 in the c_i update"),
    Mutant("debias-last-not-kept", "fedrun/algorithms/debiased.py",
           "        return clients_state._replace(last=scatter(clients_state.last, ids, w))",
           "        return clients_state",
           ("tests/test_golden_pfl.py", "-k", "pavg_proto"),
           "eval_model=clients_mean: the clients' latest models never stored (the initial model served)"),
    # every partitioner (issue 38 item 15): what defines it, one mutant each at least
    Mutant("iid-in-order", PARTS, "owner[rng.permutation(len(labels))] = np.arange(len(labels))",
           "owner[np.arange(len(labels))] = np.arange(len(labels))", (PTESTS,),
           "partition=iid deals rows in dataset order (contiguous blocks), not shuffled"),
    Mutant("dirichlet-alpha-ignored", PARTS, "_dirichlet_rows(len(counts), num_clients, alpha, rng)",
           "_dirichlet_rows(len(counts), num_clients, 1.0, rng)", (PTESTS,), "partition=dirichlet draws with alpha 1"),
    Mutant("dirichlet-min-size-ignored", PARTS, "if sizes.min() >= min_size:", "if True:", (PTESTS,),
           "partition=dirichlet keeps the first draw whatever min_size says"),
    Mutant("shards-in-order", PARTS, "client_of_shard = rng.permutation(total) // s",
           "client_of_shard = np.arange(total) // s", (PTESTS,),
           "partition=shards gives each client consecutive shards"),
    Mutant("classes-unseeded", PARTS, "perm = rng.permutation(len(present))", "perm = np.arange(len(present))",
           (PTESTS,), "partition=classes: client c owns classes c*k.. whatever the seed"),
    Mutant("quantity-in-order", PARTS, "return _groups(owner, num_clients, rng.permutation(n))",
           "return _groups(owner, num_clients, np.arange(n))", (PTESTS,),
           "partition=quantity deals rows in dataset order (each client a contiguous, label-skewed block)"),
    Mutant("quantity-sizes-unseeded", PARTS, "w = np.exp(rng.normal(0.0, _positive(\"sigma\", sigma), num_clients))",
           "w = np.exp(np.random.default_rng(0).normal(0.0, _positive(\"sigma\", sigma), num_clients))", (PTESTS,),
           "partition=quantity sizes=lognormal: the sizes drawn with seed 0 whatever the seed"),
    Mutant("mixture-drops-small-iid-share", PARTS, "owner = rng.permutation(num_clients)[:k]", "owner = np.full(k, -1)",
           (PTESTS,),
           "partition=mixture: an iid share smaller than the clients goes to nobody (the red team's 70 rows)"),
    Mutant("mixture-iid-frac-ignored", PARTS, "k = int(round(iid_frac * n))", "k = int(round(0.5 * n))", (PTESTS,),
           "partition=mixture deals half the rows iid whatever iid_frac says"),
    Mutant("perfedavg-split-unseeded", PAPER, "return perfedavg_mnist(labels, self.num_clients, self.a, _rs(rng))",
           "return perfedavg_mnist(labels, self.num_clients, self.a, np.random.RandomState(0))", (PTESTS,),
           "partition=perfedavg_split drawn with seed 0 whatever the seed"),
    Mutant("pfedme-labels-unseeded", PAPER,
           "return pfedme_mnist(labels, self.num_clients, self.labels_per_client, _rs(rng))",
           "return pfedme_mnist(labels, self.num_clients, self.labels_per_client, np.random.RandomState(0))", (PTESTS,),
           "partition=pfedme_labels drawn with seed 0 whatever the seed"),
    Mutant("acid-unseeded", PAPER, "        rs = _rs(rng)\n", "        rs = np.random.RandomState(0)\n", (PTESTS,),
           "partition=acid drawn with seed 0 whatever the seed"),
    Mutant("natural-rows-to-wrong-writers", PARTS,
           "return _groups(owner.astype(np.int64), len(ids), np.arange(len(labels)))",
           "return _groups(owner.astype(np.int64), len(ids), np.arange(len(labels))[::-1])", (PTESTS,),
           "partition=natural gives a writer's rows to another writer"),
    Mutant("composed-partition-seed-ignored", SHARED, "rng = np.random.default_rng([self.seed, 23])",
           "rng = np.random.default_rng([0, 23])", (PTESTS,),
           "every composed partition drawn with seed 0 whatever partition.seed says (issue 38's survivor)"),
    Mutant("holdout-rounding-to-none-accepted", SHARED,
           "if isinstance(holdout, float) and 0 < holdout < 1 and not 0 < count < num_clients:", "if False:", (PTESTS,),
           "partition.holdout=0.004 of 100 clients holds out nobody without a word"),
    Mutant("stratified-split-unshuffled", SHARED, "order = np.lexsort((rng.random(n_rows), labels, owner))",
           "order = np.lexsort((np.arange(n_rows), labels, owner))", (PTESTS,),
           "test=split: a client's test rows no longer drawn at random within a label"),
    Mutant("nonfinite-guard-off", "fedrun/simulate.py",
           "    return torch.nonzero(~ok).flatten().tolist() if not bool(ok.all()) else []",
           "    return []",
           ("tests/test_resume.py", "tests/test_batched.py", "-k", "diverg"), "the divergence guard never fires"),
    # compile= (issue 37)
    Mutant("graphs-input-not-refilled", "fedrun/run/acceleration.py",
           "            static[i].copy_(leaves[i])", "            pass",
           ("tests/test_acceleration.py", "-k", "graph"), "compile=graphs replays without refilling its static inputs"),
    Mutant("step-uses-round-false", "fedrun/algorithms/debiased.py",
           "        return self.lr_decay != 1 or super().step_uses_round", "        return False",
           ("tests/test_acceleration.py", "-k", "round"),
           "FedDyn/SCAFFOLD/PFL's decaying lr not declared round-dependent"),
    Mutant("compiled-step-round-fixed", "fedrun/run/acceleration.py",
           'rnd = rnd if getattr(algo, "step_uses_round", False) else 0', "rnd = 0",
           ("tests/test_acceleration.py", "-k", "compiled_local_steps"), "compile=default gives every step round 0"),
    Mutant("compiled-step-graph-breaks", "fedrun/run/acceleration.py",
           "        return torch._dynamo.config.patch(trace_autograd_ops=True)",
           "        return contextlib.nullcontext()",
           ("tests/test_acceleration.py", "-k", "compiled_local_steps and scaffold"),
           "compile=default breaks the step's graph at each torch.autograd.grad (3-5x the compile time)"),
    # the round's rates as tensors (issue 48 item 1): one captured graph in rounds whose lr changes
    Mutant("graphs-rates-not-refreshed", "fedrun/run/acceleration.py",
           "        rates.at(rnd)\n        replay()", "        replay()",
           ("tests/test_rates.py", "-k", "graphs_replay"), "compile=graphs replays without the round's rates"),
    Mutant("rates-fill-skipped", "fedrun/algorithms/rates.py",
           "            t.fill_(float(fn(self._rnd)))", "            pass",
           ("tests/test_rates.py", "-k", "round_numbers_numbers"), "RoundRates.at keeps the first round's rates"),
    Mutant("rates-key-without-base-lr", "fedrun/algorithms/optim.py",
           '("optim.lr_at", self, lr))', '("optim.lr_at", self))',
           ("tests/test_rates.py", "-k", "two_base_lrs or apple"), "two base lrs of one schedule share one rate"),
    Mutant("sgd-rate-two-roundings", "fedrun/algorithms/rates.py",
           "    return torch.addcmul(p, -lr.to(p.dtype), g)", "    return p - lr.to(p.dtype) * g",
           ("tests/test_rates.py", "-k", "fused or momentum"), "SGD's rate tensor update rounds lr * g apart"),
    Mutant("sgd-rate-probe-off", "fedrun/algorithms/rates.py",
           "        _FUSED[key] = bool(torch.equal(p.add(g, alpha=-lr), torch.addcmul(p, -rate, g)))",
           "        _FUSED[key] = True",
           ("tests/test_rates.py", "-k", "fused"), "addcmul taken for SGD's fused update without checking it"),
    # the run wing (issue 47 item 1): a job's algorithm and model built once, by its spec
    Mutant("spec-model-built-twice", "fedrun/run/spec.py",
           '        model, rng = model_built["model"], torch.get_rng_state()',
           '        model_problems(cfg, algo, model_built, in_features=data.in_features, '
           'num_classes=data.num_classes)\n'
           '        model, rng = model_built["model"], torch.get_rng_state()',
           ("tests/test_batched.py", "-k", "builds_its"), "a job builds its model a second time"),
    # rounds of phases, local work in epochs (issue 34 item 6)
    Mutant("fedrep-epochs-body-first", "fedrun/algorithms/fedrep.py",
           "return Phase(self.head_step, epochs=self.head_epochs), Phase(self.body_step, epochs=self.local_epochs)",
           "return Phase(self.body_step, epochs=self.local_epochs), Phase(self.head_step, epochs=self.head_epochs)",
           (EPOCH_TRACES, "-k", "fedrep"), "FedRep in epochs: the body's epochs before the head's"),
    Mutant("ditto-epochs-personal-dropped", "fedrun/algorithms/ditto.py",
           "Phase(self.personal_step, epochs=self.personal_epochs)", "Phase(self.personal_step, epochs=0)",
           (EPOCH_TRACES, "-k", "ditto"), "Ditto in epochs: the personal model's epochs dropped"),
    Mutant("finetune-epochs-one-short", "fedrun/algorithms/personalize.py",
           "idx, steps, epochs, step), None", "idx, steps, epochs - 1, step), None",
           (EPOCH_TRACES, "-k", "fedbabu"), "fine-tuning in epochs (FedBABU's): one pass short"),
    Mutant("phases-mask-off", "fedrun/simulate.py",
           "    if live is None:\n        return new", "    if True:\n        return new",
           (EPOCH_TRACES,), "rounds of phases: every client takes the largest client's steps (no mask)"),
    Mutant("epochs-partial-batch-kept", "fedrun/simulate.py",
           "per_pass = sizes // (k * B if ph.disjoint else B)",
           "per_pass = -(-sizes // (k * B if ph.disjoint else B))",
           ("tests/test_phases.py",), "epochs phases: a pass keeps its partial last minibatch (no drop_last)"),
    Mutant("epochs-by-work-pass-stride", "fedrun/engine/work.py",
           "            t = e * stride + s\n", "            t = e * longest + s\n",
           ("tests/test_phases.py", "-k", "largest"),
           "epochs by work: a pass's stride the round's clients' longest, not the draw's (a round without the "
           "largest client)"),
    Mutant("bench-epochs-depth-pass", "fedrun/bench/epochs.py",
           "return int(d.live.sum(1).max()) if d.live is not None else d.idx.shape[1]", "return d.idx.shape[1]",
           ("tests/test_bench.py", "-k", "epochs"),
           "fedrun-bench --epochs: a round's sequential steps the draw's pass (all clients' largest), not its own "
           "largest client's"),
    Mutant("bench-epochs-floor-steps", "fedrun/bench/epochs.py",
           "        for s in range(depth):\n            opt.zero_grad()",
           "        for s in range(depth // 2):\n            opt.zero_grad()",
           ("tests/test_bench.py", "-k", "epochs"),
           "fedrun-bench --epochs: the floor runs half the epoch round's sequential steps"),
    # the representation methods of issue 36 (tests/test_golden_pfllib_feat.py)
    Mutant("moon-contrast-swapped", "fedrun/algorithms/moon.py",
           "out = out + mu * (torch.logsumexp(sims, 0) - sims[0]).mean()",
           "out = out + mu * (torch.logsumexp(sims, 0) - sims[1]).mean()",
           (FEAT_TRACES, "-k", "moon"), "MOON: the previous model as the positive, the server model as the negative"),
    Mutant("fedrod-balanced-dropped", "fedrun/algorithms/fedrod.py",
           "balanced = engine.criterion(logits + counts.log(), y)", "balanced = engine.criterion(logits, y)",
           (FEAT_TRACES, "-k", "fedrod"), "FedRoD: plain cross-entropy instead of the balanced softmax"),
    Mutant("fedrod-personal-alone", "fedrun/algorithms/fedrod.py",
           "return balanced + engine.criterion(logits.detach() + mine, y)",
           "return balanced + engine.criterion(mine, y)",
           (FEAT_TRACES, "-k", "fedrod"),
           "FedRoD: the personal head trained on its own logits, not added to the generic ones"),
    Mutant("fedproto-distance-summed", "fedrun/algorithms/fedproto.py",
           "out = out + lam * ((target - z) ** 2).mean()", "out = out + lam * ((target - z) ** 2).sum(-1).mean()",
           (FEAT_TRACES, "-k", "fedproto"),
           "FedProto: the squared distance summed over the representation, not averaged"),
    Mutant("fedproto-always-weighted", "fedrun/algorithms/fedproto.py",
           "w = counts if self.follow == \"paper\" else has.to(counts.dtype)", "w = counts",
           (FEAT_TRACES, "-k", "fedproto"), "FedProto: the global prototypes weighted by rows under follow=pfllib too"),
    Mutant("fedproto-protos-after-step", "fedrun/algorithms/fedproto.py",
           "z = step_features(engine, local.params, x)",
           "z = step_features(engine, self.descend(local, \"params\", engine.grad(local.params, x, y)[0], "
           "self.lr, rnd).params, x)",
           (FEAT_TRACES, "-k", "fedproto"),
           "FedProto: local prototypes from the model after the step (a plain CE step)"),
    Mutant("feddbe-momentum-swapped", "fedrun/algorithms/feddbe.py",
           "r = (1 - mom) * running + mom * z.mean(0)", "r = mom * running + (1 - mom) * z.mean(0)",
           (FEAT_TRACES, "-k", "feddbe"), "FedDBE: the running mean's momentum on the wrong term (in the loss)"),
    Mutant("feddbe-global-mean-unweighted", "fedrun/algorithms/feddbe.py",
           "g = (n.unsqueeze(-1) * r).sum(0) / n.sum()", "g = r.mean(0)",
           (FEAT_TRACES, "-k", "feddbe"), "FedDBE: the global mean unweighted by the clients' rows"),
    Mutant("feddbe-bias-frozen", "fedrun/algorithms/feddbe.py",
           "\"bias\": bias - self.lr * g[BIAS]", "\"bias\": bias",
           (FEAT_TRACES, "-k", "feddbe"), "FedDBE: the representation bias never trained"),
    Mutant("feddbe-prepare-epochs-ignored", "fedrun/algorithms/feddbe.py",
           "        if self.local_epochs is None:\n            r = ctx.chunked(",
           "        if True:\n            r = ctx.chunked(",
           ("tests/algorithms/test_representation.py", "-k", "local_epochs"),
           "FedDBE: the round before round 1 tau steps whatever local_epochs says"),
    Mutant("feddbe-prepare-one-pass", "fedrun/algorithms/feddbe.py",
           "lambda cs: self.client_init(state, cs, 0), everyone, self.local_epochs,",
           "lambda cs: self.client_init(state, cs, 0), everyone, 1,",
           ("tests/algorithms/test_representation.py", "-k", "local_epochs"),
           "FedDBE: the round before round 1 one pass whatever local_epochs says"),
    Mutant("pfedme-served-bn-local-ignored", "fedrun/algorithms/pfedme.py",
           'own = self.own_statistics(state)',
           'own = None',
           ("tests/algorithms/test_pfedme.py", "-k", "bn_local_start"),
           "pFedMe bn=local: the PMs computed at test time start from the server's statistics, not the client's"),
    Mutant("pfedme-served-epochs-ignored", "fedrun/algorithms/pfedme.py",
           "        if self.local_epochs is not None:  # the training's local work",
           "        if False:  # the training's local work",
           ("tests/algorithms/test_pfedme.py", "-k", "local_epochs"),
           "pFedMe: the PMs computed at test time in tau steps whatever local_epochs says"),
    Mutant("prepare-skipped", "fedrun/simulate.py",
           "Progress(algo.prepare(engine, algo.init(r.params, data.num_clients),",
           "Progress((lambda engine, state, ctx: state)(engine, algo.init(r.params, data.num_clients),",
           (FEAT_TRACES, "-k", "fedrod or feddbe"),
           "the round loop never calls Algorithm.prepare (FedRoD's counts, FedDBE's global mean)"),
]

# issue 36, model-mixing methods: each one's key line against its PFLlib trace
MIX_TRACES = "tests/test_golden_pfllib_mix.py::test_official_protocol_replays_pfllib_mixing"
MUTANTS += [
    Mutant("fedamp-attention-unscaled", "fedrun/algorithms/fedamp.py",
           "self.alpha_k * torch.exp(-d / self.sigma) / self.sigma", "self.alpha_k * torch.exp(-d / self.sigma)",
           (MIX_TRACES, "-k", "fedamp"), "FedAMP: the attention weight exp(-d / sigma) without its 1 / sigma"),
    Mutant("fedphp-mmd-dropped", "fedrun/algorithms/fedphp.py",
           "torch.nn.functional.cross_entropy(logits, y) + lam * mmd_rbf(",
           "torch.nn.functional.cross_entropy(logits, y) + 0 * mmd_rbf(",
           (MIX_TRACES, "-k", "fedphp"), "FedPHP: the MMD toward the inherited model dropped from the loss"),
    Mutant("fedphp-inherit-swapped", "fedrun/algorithms/fedphp.py",
           "w[k] * per_client(1 - mu, w[k]) + v[k] * per_client(mu, w[k])",
           "w[k] * per_client(mu, w[k]) + v[k] * per_client(1 - mu, w[k])",
           (MIX_TRACES, "-k", "fedphp"), "FedPHP: v_i <- mu_t w_i + (1 - mu_t) v_i (the weights swapped)"),
    Mutant("fedala-weight-step-sign", "fedrun/algorithms/fedala.py",
           "local.weights[k] - self.eta * (g[k] * (G[k] - L[k]))",
           "local.weights[k] + self.eta * (g[k] * (G[k] - L[k]))",
           (MIX_TRACES, "-k", "fedala"), "FedALA: the ALA weights climb the loss (the step's sign flipped)"),
    # issue 36's methods with modules beside the model (tests/test_golden_pfllib_module.py)
    Mutant("fedpac-alignment-sum", "fedrun/algorithms/fedpac.py",
           "return ce + lam * ((target - feats) ** 2).mean()", "return ce + lam * ((target - feats) ** 2).sum()",
           ("tests/test_golden_pfllib_module.py", "-k", "fedpac_replays"),
           "FedPAC's alignment term summed over the features instead of averaged"),
    Mutant("fedpac-qp-no-bias", "fedrun/algorithms/fedpac.py",
           "+ E @ E.transpose(1, 2)).double()", "+ 0 * E @ E.transpose(1, 2)).double()",
           ("tests/test_golden_pfllib_module.py", "-k", "fedpac_replays"),
           "FedPAC's head QP without its bias term D_i"),
    Mutant("gpfl-alignment-squared", "fedrun/algorithms/gpfl.py",
           "lam * torch.linalg.norm(feat_g - frozen[y])", "lam * torch.linalg.norm(feat_g - frozen[y]) ** 2",
           ("tests/test_golden_pfllib_module.py", "-k", "gpfl_replays"), "GPFL's alignment: the squared norm"),
    Mutant("gpfl-cov-no-identity", "fedrun/algorithms/gpfl.py",
           "return F.relu(feat * (gamma + 1) + beta)", "return F.relu(feat * gamma + beta)",
           ("tests/test_golden_pfllib_module.py", "-k", "gpfl_replays"), "GPFL's CoV scales by gamma, not gamma + 1"),
    Mutant("fedcp-gate-no-noise", "fedrun/algorithms/fedcp.py",
           "gate = torch.softmax(z if noise is None else z + noise, dim=-2)", "gate = torch.softmax(z, dim=-2)",
           ("tests/test_golden_pfllib_fedcp.py", "-k", "replays"), "FedCP's gate without its Gumbel noise in training"),
    Mutant("fedcp-gate-swapped", "fedrun/algorithms/fedcp.py",
           "return F.linear(feat * gate[..., 0, :], *head_p) + F.linear(feat * gate[..., 1, :], *head_g)",
           "return F.linear(feat * gate[..., 1, :], *head_p) + F.linear(feat * gate[..., 0, :], *head_g)",
           ("tests/test_golden_pfllib_fedcp.py", "-k", "replays"), "FedCP's gate halves swapped between the heads"),
    Mutant("fedcp-upload-unmixed", "fedrun/algorithms/fedcp.py",
           "upload = add(scale(mine, 0.5), scale(local.head_g, 0.5))",
           "upload = mine",
           ("tests/test_golden_pfllib_fedcp.py", "-k", "replays"),
           "FedCP uploads its personalized head as the global one (no mixing)"),
]

# issue 36, APPLE: its key lines against its PFLlib trace
APPLE_TRACE = "tests/test_golden_pfllib_apple.py"
MUTANTS += [
    Mutant("apple-proximal-dropped", "fedrun/algorithms/apple.py",
           "grad = dots + (local.lam * self.mu).unsqueeze(1) * (p - local.p0)", "grad = dots",
           (APPLE_TRACE,), "APPLE: the proximal pull of p_i toward p0 dropped from p's gradient"),
    Mutant("apple-own-core-frozen", "fedrun/algorithms/apple.py",
           "dots = torch.where(own.bool(), mine.unsqueeze(1), dots)", "dots = dots",
           (APPLE_TRACE,), "APPLE: p_ii's gradient with the client's core as downloaded, not as it trains"),
    Mutant("apple-core-lr-unscaled", "fedrun/algorithms/apple.py",
           "pii = (p * own).sum(1) * local.scale", "pii = (p * own).sum(1)",
           (APPLE_TRACE,), "APPLE: the own core's step without PFLlib's lr x C"),
]
# issue 44 item 3, APPLE and FedCP on BatchNorm models (tests/algorithms/test_trainer_bn4.py)
BN4 = "tests/algorithms/test_trainer_bn4.py"
MUTANTS += [
    Mutant("apple-bn-step-statistics-dropped", "fedrun/algorithms/apple.py",
           'g, _, local = self.grad(engine, local._replace(theta={**local.theta, **self.theta(local)}), "theta", x, y)',
           'g, _, _ = self.grad(engine, local._replace(theta={**local.theta, **self.theta(local)}), "theta", x, y)\n'
           '        local = local._replace(theta={**local.theta, **self.theta(local)})',
           (BN4, "-k", "apple_step"), "APPLE: the step's training-mode forward does not move theta_i's statistics"),
    Mutant("apple-bn-paper-served-initial-statistics", "fedrun/algorithms/apple.py",
           'return self.with_statistics(mix(state.clients.p["p"], state.clients.params), state.clients.theta), None',
           'return self.with_statistics(mix(state.clients.p["p"], state.clients.params), '
           'stack(state.params, len(state.clients.p["p"]))), None',
           (BN4, "-k", "apple_serves"), "APPLE paper: theta_i served with the initial model's statistics, not its own"),
    Mutant("apple-bn-onboard-statistics-dropped", "fedrun/algorithms/apple.py",
           'theta=scatter(state.clients.theta, new, self.with_statistics(self.theta(local), local.theta)))',
           'theta=scatter(state.clients.theta, new, self.with_statistics(self.theta(local), '
           'state.clients.theta, new)))',
           (BN4, "-k", "apple_held_out"), "APPLE: a held-out client's onboarding forwards do not move its statistics"),
    Mutant("fedcp-bn-model-statistics-dropped", "fedrun/algorithms/fedcp.py",
           'P = {**local.params, **{k: v for k, v in untagged(moved.q, "m.").items() if is_buffer(k)}}',
           'P = dict(local.params)',
           (BN4, "-k", "fedcp_step"), "FedCP: the model's training-mode forward does not move its statistics"),
    Mutant("fedcp-bn-frozen-statistics-kept", "fedrun/algorithms/fedcp.py",
           'untagged(moved.q, "m.").items() if is_buffer(k)}}', 'untagged(moved.q, "f.").items() if is_buffer(k)}}',
           (BN4, "-k", "fedcp_step"), "FedCP: the frozen copy's moved statistics kept as the model's"),
    Mutant("fedcp-bn-frozen-copy-eval-mode", "fedrun/algorithms/fedcp.py",
           "feat0 = engine.features({**base, head[0]: model[head[0]], head[1]: model[head[1]]}, x)",
           "feat0 = torch.func.functional_call(engine.model.eval(), {**base, head[0]: model[head[0]], "
           "head[1]: model[head[1]]}, (x,), {\"features\": True}); engine.model.train()",
           (BN4, "-k", "fedcp_step"), "FedCP: the frozen copy of the received body runs in eval mode (its running "
                                      "statistics), not PFLlib's train() (batch statistics)"),
    Mutant("fedcp-bn-local-served-server-statistics", "fedrun/algorithms/bodyhead.py",
           "return self.with_own_statistics(state, {**expand(state.params, C), **mine}), None",
           "return {**expand(state.params, C), **mine}, None",
           (BN4, "-k", "fedcp_serves"), "FedCP bn=local: every client served the server's statistics, not its own "
                                        "(PartSharing's served models, FedCP's base)"),
]
# issue 44, item 3: under bn=local every client's served model carries its own statistics of the shared model
# (tests/algorithms/test_bn_local_served.py)
SERVED = "tests/algorithms/test_bn_local_served.py"
MUTANTS += [
    Mutant("bodyhead-bn-local-served-server-stats", "fedrun/algorithms/bodyhead.py",
           "return self.with_own_statistics(state, {**expand(state.params, C), **mine}), None",
           "return {**expand(state.params, C), **mine}, None",
           (SERVED, "-k", "carry and (fedper or fedrep)"),
           "FedPer/FedRep/LG-FedAvg (PartSharing) bn=local: served the server's statistics of the shared part"),
    Mutant("bodyhead-bn-local-onboard-server-stats", "fedrun/algorithms/bodyhead.py",
           "local = PartLocal(params=self.with_own_statistics(state, self.whole_models(state, new), new))",
           "local = PartLocal(params=self.whole_models(state, new))",
           (SERVED, "-k", "carry and fedper"),
           "PartSharing bn=local: a held-out client's onboarding starts from the server's statistics"),
    Mutant("bodyhead-bn-local-onboard-stats-dropped", "fedrun/algorithms/bodyhead.py",
           "trainer=self.kept_own_statistics(state, new, local.params))", "trainer=state.trainer)",
           (SERVED, "-k", "carry and fedrep"),
           "PartSharing bn=local: what a held-out client's onboarding moved of its own statistics is dropped"),
    Mutant("bn-local-own-statistics-none", "fedrun/algorithms/trainer.py",
           'return state.trainer.get("bn_local") if self.bn == "local" else None',
           'return None',
           (SERVED,), "bn=local: nothing served, fine-tuned or onboarded with each client's own statistics"),
    Mutant("bn-local-kept-own-statistics-all-clients", "fedrun/algorithms/trainer.py",
           '"bn_local": scatter(own, ids, {k: models[k] for k in own})}',
           '"bn_local": {k: models[k][:1].expand_as(v) for k, v in own.items()}}',
           (SERVED, "-k", "carry and gpfl"), "bn=local: an onboarding's statistics written over every client's"),
    Mutant("feddbe-bn-local-served-server-stats", "fedrun/algorithms/feddbe.py",
           "return self.with_own_statistics(state, served), None", "return served, None",
           (SERVED, "-k", "carry and feddbe"), "FedDBE bn=local: served the server's statistics"),
    Mutant("fedrod-bn-local-served-server-stats", "fedrun/algorithms/fedrod.py",
           "return self.with_own_statistics(state, served), None", "return served, None",
           (SERVED, "-k", "carry and fedrod"), "FedRoD bn=local: served the server's statistics"),
    Mutant("fedrod-bn-local-onboard-stats-dropped", "fedrun/algorithms/fedrod.py",
           'if generic or self.bn == "local":', "if generic:",
           (SERVED, "-k", "carry and fedrod"), "FedRoD bn=local: a held-out client's onboarding leaves its statistics"),
    Mutant("finetune-served-bn-local-server-stats", "fedrun/algorithms/base.py",
           "else own_start(self, state, self.eval_params(state),",
           "else (lambda *a: (a[2], False))(self, state, self.eval_params(state),",
           (SERVED, "-k", "test_time and moon"),
           "algo.finetune_* from the global model, bn=local: every client fine-tunes the server's statistics"),
    Mutant("perfedavg-test-batches-bn-local-server-stats", "fedrun/algorithms/perfedavg.py",
           "p = self.with_own_statistics(state, stack(state.params, ctx.data.num_clients))",
           "p = stack(state.params, ctx.data.num_clients)",
           (SERVED, "-k", "test_time and perfedavg"), "Per-FedAvg test_batches bn=local: from the server's statistics"),
    Mutant("finetune-epochs-stacked-ignored", "fedrun/algorithms/personalize.py",
           "steps_by_work(params if stacked else expand(params, split.num_clients),",
           "steps_by_work(expand({k: (v[0] if stacked else v) for k, v in params.items()}, split.num_clients),",
           (SERVED, "-k", "epochs"), "finetune_epochs from client 0's model for every client (bn=local)"),
    Mutant("debiased-proto-bn-local-copies", "fedrun/algorithms/debiased.py",
           "ctx.data.num_clients, views=True)", "ctx.data.num_clients, views=False)",
           (SERVED, "-k", "pavg"), "P-Avg proto bn=local: the shared parameters copied per client (memory)"),
    Mutant("debiased-proto-bn-local-server-stats", "fedrun/algorithms/debiased.py",
           "return self.adapt.personalize(engine, params, ctx.data.train, shared=not each)",
           "return self.adapt.personalize(engine, self.eval_params(state), ctx.data.train)",
           (SERVED, "-k", "carry and pavg"), "P-Avg proto bn=local: prototypes of the server's statistics"),
    Mutant("ditto-bn-local-onboard-server-stats", "fedrun/algorithms/ditto.py",
           "personal = self.own_models(state, new)",
           "personal = stack(state.params, m)",
           (SERVED, "-k", "held_out and ditto"), "Ditto bn=local: a held-out client's personal model from the server's "
                                                 "statistics, not its own (the initial model's)"),
    Mutant("fedala-bn-local-onboard-server-stats", "fedrun/algorithms/fedala.py",
           "local = ModelLocal(params=self.own_models(state, new))",
           "local = ModelLocal(params=stack(state.params, len(new)))",
           (SERVED, "-k", "held_out and fedala"), "FedALA bn=local: a held-out client from the server's statistics"),
    Mutant("apfl-bn-local-onboard-v-server-stats", "fedrun/algorithms/apfl.py",
           "v=self.own_models(state, new))", "v=stack(state.params, len(new)))",
           (SERVED, "-k", "held_out and apfl"), "APFL bn=local: a held-out client's v from the server's statistics"),
    Mutant("fedphp-bn-local-onboard-server-stats", "fedrun/algorithms/fedphp.py",
           "local = local._replace(params=self.with_own_statistics(state, local.params, new))",
           "local = local._replace(params=local.params)",
           (SERVED, "-k", "held_out and fedphp"), "FedPHP bn=local: a held-out client from the server's statistics"),
    Mutant("fedamp-bn-local-onboard-server-stats", "fedrun/algorithms/fedamp.py",
           "w = self.own_models(state, new)",
           "w = stack(state.params, len(new))",
           (SERVED, "-k", "held_out and fedamp"), "FedAMP bn=local: a held-out client from the server's statistics"),
    Mutant("fedfomo-bn-local-onboard-server-stats", "fedrun/algorithms/fedfomo.py",
           "start = self.own_models(state, new)",
           "start = stack(state.params, len(new))",
           (SERVED, "-k", "held_out and fedfomo"), "FedFomo bn=local: a held-out client from the server's statistics"),
]
# issue 44, the mixing and representation methods on the local trainer (tests/algorithms/test_trainer_mixing.py)
TRAINER_MIX = "tests/algorithms/test_trainer_mixing.py"
MUTANTS += [
    Mutant("apfl-v-no-optimizer", "fedrun/algorithms/apfl.py",
           'local = self.descend(local._replace(v={**v, **buffers}), "v", gv, self.lr, rnd)',
           'local = local._replace(v={**v, **buffers, **{k: v[k] - self.lr * gv[k] for k in gv}})',
           (TRAINER_MIX, "-k", "weight_decay and apfl"), "APFL: v's step by plain SGD whatever optim.* says"),
    Mutant("apfl-mixture-statistics-dropped", "fedrun/algorithms/apfl.py",
           'buffers = {k: t for k, t in mixed.params.items() if is_buffer(k)}', "buffers = {}",
           (TRAINER_MIX, "-k", "batchnorm and apfl"), "APFL: the mixture's running statistics not kept in v"),
    Mutant("moon-statistics-dropped", "fedrun/algorithms/moon.py",
           'g, _, local = self.value_and_grad(engine, local, "params", loss',
           'g, _, _ = self.value_and_grad(engine, local, "params", loss',
           (TRAINER_MIX, "-k", "batchnorm and moon"), "MOON: the step's running statistics dropped"),
    Mutant("moon-no-optimizer", "fedrun/algorithms/moon.py",
           'return self.descend(local, "params", g, self.lr, rnd)',
           'return local._replace(params={**local.params, **{k: local.params[k] - self.lr * g[k] for k in g}})',
           (TRAINER_MIX, "-k", "weight_decay and moon"), "MOON: plain SGD whatever optim.* says"),
    Mutant("step-features-statistics-leak", "fedrun/algorithms/representation.py",
           "return client_features(engine, {**params, **{k: v.clone() for k, v in buffers.items()}}, x)",
           "return client_features(engine, state, x)",
           (TRAINER_MIX, "-k", "batchnorm and (fedproto or feddbe)"),
           "FedProto/FedDBE: the prototype / running-mean forward moves the model's statistics a second time"),
    Mutant("fedproto-no-optimizer", "fedrun/algorithms/fedproto.py",
           'return self.descend(local, "params", g, self.lr, rnd)._replace(sums=sums, counts=counts)',
           'return local._replace(params={**local.params, **{k: local.params[k] - self.lr * g[k] for k in g}}, '
           'sums=sums, counts=counts)',
           (TRAINER_MIX, "-k", "weight_decay and fedproto"), "FedProto: plain SGD whatever optim.* says"),
    Mutant("feddbe-bias-no-optimizer", "fedrun/algorithms/feddbe.py",
           'return self.descend(local, "dbe", {"bias": g[BIAS]}, self.lr, rnd)',
           'return local._replace(dbe={"bias": bias - self.lr * g[BIAS]})',
           (TRAINER_MIX, "-k", "weight_decay and feddbe"), "FedDBE: the bias by plain SGD whatever optim.* says"),
    Mutant("fedamp-attention-over-statistics", "fedrun/algorithms/fedamp.py",
           "names = param_names(w)", "names = [k for k in w if w[k].is_floating_point()]",
           (TRAINER_MIX, "-k", "fedamp_attention"), "FedAMP: distances and cloud models over the running statistics"),
    Mutant("fedamp-no-optimizer", "fedrun/algorithms/fedamp.py",
           'return self.descend(local, "params", g, self.lr, rnd)',
           'return local._replace(params={**local.params, **{k: local.params[k] - self.lr * g[k] for k in g}})',
           (TRAINER_MIX, "-k", "weight_decay and fedamp"), "FedAMP: plain SGD whatever optim.* says"),
    Mutant("fedphp-two-forwards", "fedrun/algorithms/fedphp.py",
           "z, logits = features_and_logits(engine, p, x)", "z, logits = engine.features(p, x), engine.logits(p, x)",
           (TRAINER_MIX, "-k", "batchnorm and fedphp"),
           "FedPHP: two training forwards a step (statistics moved twice)"),
]
MUTANTS += [  # issue 44: typed per-client state (state_of rebuilds a checkpoint's in the declared type)
    Mutant("typed-clients-undeclared", "fedrun/algorithms/fedfomo.py",
           "    Clients = FedFomoClients\n", "",
           ("tests/algorithms/test_typed_state.py",), "FedFomo: its Clients type not declared (resumes as a dict)"),
]

META = "tests/algorithms/test_trainer_meta.py"
MUTANTS += [  # the local trainer under Per-FedAvg, pFedMe, FedBN and FedAvg's bn=local (issue 44)
    Mutant("perfedavg-outer-step-loses-statistics", "fedrun/algorithms/perfedavg.py",
           'else {**w, **only(w_tilde, [k for k in w if k not in g])}', "else w",
           (META, "-k", "perfedavg_outer"), "Per-FedAvg: the new w keeps the statistics before D', not after"),
    Mutant("perfedavg-outer-step-of-alpha", "fedrun/algorithms/perfedavg.py",
           'return self.descend(local._replace(params=start), "params", g2, self.beta, rnd)',
           'return self.descend(local._replace(params=start), "params", g2, self.alpha, rnd)',
           (META, "-k", "perfedavg_outer"), "Per-FedAvg: the outer step's optimizer at lr alpha, not beta"),
    Mutant("pfedme-envelope-gradient-unscaled", "fedrun/algorithms/pfedme.py",
           "t.mul_(self.lam)  # the Moreau envelope's gradient", "t.mul_(1.0)  # the Moreau envelope's gradient",
           (META, "-k", "pfedme_envelope"), "pFedMe: the optimizer steps along w - theta, not lam (w - theta)"),
    Mutant("pfedme-server-mixes-statistics", "fedrun/algorithms/pfedme.py",
           "if k in mixed else avg[k] for k in avg}", "if k in mixed or 'running' in k else avg[k] for k in avg}",
           (META, "-k", "pfedme_server"), "pFedMe: running statistics mixed with beta like the parameters"),
    Mutant("pfedme-bn-local-theta-server-stats", "fedrun/algorithms/pfedme.py",
           "theta={**local.theta, **buffers})", "theta=local.theta)",
           (META, "-k", "pfedme_bn_local"), "pFedMe bn=local: theta starts from the server's statistics"),
    Mutant("fedbn-bn-local-server-mean", "fedrun/algorithms/fedbn.py",
           'if self.bn == "local":  # the server', 'if self.bn == "never":  # the server',
           (META, "-k", "bn_local_keeps and fedbn"), "FedBN bn=local: the server's statistics the mean"),
    Mutant("bn-local-server-last-client", "fedrun/algorithms/trainer.py",
           "first = {k: v[selected[0]] for k, v in buffers.items()}",
           "first = {k: v[selected[-1]] for k, v in buffers.items()}",
           (META, "-k", "bn_local_keeps and fedavg"), "bn=local: the server carries the last aggregated client's"),
    Mutant("bn-local-not-kept", "fedrun/algorithms/trainer.py",
           "own = self.own_statistics(state)\n        if own is not None:\n            local = self.with_shared_",
           "own = None\n        if own is not None:\n            local = self.with_shared_",
           (META, "-k", "bn_local"), "bn=local: a client restarts from the server's statistics"),
]
MUTANTS += [  # the pFedMe authors' traces at their derived tolerance (issue 46)
    Mutant("pfedme-inner-steps-one-less", "fedrun/algorithms/pfedme.py",
           "for _ in range(self.K):  # the inner problem", "for _ in range(self.K - 1):  # the inner problem",
           ("tests/test_golden_pfedme.py::test_official_protocol_replays_the_authors_code[pfedme-mclr]",),
           "pFedMe: K - 1 inner steps on theta, not K"),
]
FOMO_TRACE = "tests/test_golden_pfllib_fomo.py"
MUTANTS += [
    Mutant("fedfomo-squared-distance", "fedrun/algorithms/fedfomo.py",
           "w = torch.where(live, gain / (dist + 1e-5), torch.zeros_like(dist))",
           "w = torch.where(live, gain / (dist.square() + 1e-5), torch.zeros_like(dist))",
           (FOMO_TRACE,), "FedFomo: w_n divides the loss gain by the squared distance, not the distance"),
    Mutant("fedfomo-negative-weights-kept", "fedrun/algorithms/fedfomo.py",
           "pos = w.clamp(min=0)", "pos = w.abs()",
           (FOMO_TRACE,), "FedFomo: neighbours that raise the loss mixed in (abs(w_n), not max(w_n, 0))"),
    Mutant("fedfomo-affinity-positive-only", "fedrun/algorithms/fedfomo.py",
           "local.ids[selected]), local.w[selected],",
           "local.ids[selected]), local.w[selected].clamp(min=0),",
           (FOMO_TRACE,), "FedFomo: P accumulates only the positive w_n (P's golden tolerance, issue 46)"),
]

# issue 45.2 / 46.3, the dataset readers: each against the literal rows of tests/data/test_reader_quirks.py
RQ = "tests/data/test_reader_quirks.py"
DS = "fedrun/data/datasets/"
MUTANTS += [
    Mutant("cifar-label-range-unchecked", DS + "cifar.py", "bad = np.flatnonzero((y < 0) | (y >= count))",
           "bad = np.flatnonzero(y < 0)", (RQ, "-k", "cifar_labels_outside"),
           "CIFAR: a label past the release's (fine 100, coarse 20, CIFAR-10 10) read (training stops mid-run)"),
    Mutant("cifar-coarse-not-in-cache-key", DS + "cifar.py",
           "return {k: v for k, v in s.items() if not (k == \"labels\" and v == \"fine\")}",
           "return {k: v for k, v in s.items() if k != \"labels\"}", (RQ, "-k", "label_choice_keys_the_cache"),
           "CIFAR-100: labels=coarse missing from the cache key (a cached fine run served to a coarse run)"),
    Mutant("cifar-coarse-reads-fine", DS + "cifar.py",
           "label_key=LABELS[self.labels] if self.files_classes == 100 else None)", "label_key=None)",
           (RQ, "-k", "label_choice_keys_the_cache"), "CIFAR-100: labels=coarse reads the fine labels"),
    Mutant("tinyimagenet-labels-by-name", DS + "tinyimagenet.py", "label = {w: i for i, w in enumerate(wnids)}",
           "label = {w: i for i, w in enumerate(sorted(wnids))}", (RQ, "-k", "tinyimagenet_rows"),
           "Tiny-ImageNet: labels by sorted class id, not by wnids.txt's line order"),
    Mutant("tinyimagenet-val-unsorted", DS + "tinyimagenet.py", "order = np.argsort(vap, kind=\"stable\")",
           "order = np.arange(len(vap))", (RQ, "-k", "tinyimagenet_rows"),
           "Tiny-ImageNet: val rows in val_annotations.txt's order, not by file name"),
    Mutant("tinyimagenet-fill-dropped", DS + "tinyimagenet.py", "augment_fill=(-mean / std).reshape(-1))",
           "augment_fill=None)", (RQ, "-k", "tinyimagenet_rows"),
           "Tiny-ImageNet: the crop's padding the mean colour (0), not a black pixel"),
    Mutant("tinyimagenet-duplicate-class-read", DS + "tinyimagenet.py", "        if w in first:\n",
           "        if False:\n", (RQ, "-k", "tinyimagenet_refusals"),
           "Tiny-ImageNet: a class listed twice in wnids.txt read twice under the later label"),
    Mutant("agnews-entity-kept", DS + "agnews.py", "lambda m: chr(int(m.group(1)))", "lambda m: m.group(0)",
           (RQ, "-k", "agnews"), "AG News: #39;-style entities (their & lost) kept as text"),
    Mutant("agnews-newline-escape-kept", DS + "agnews.py", "text = text.replace(\"\\\\n\", \" \").replace(",
           "text = text.replace(", (RQ, "-k", "agnews"), "AG News: the \\n escape read as a backslash and an n"),
    Mutant("agnews-html-kept", DS + "agnews.py", "return html.unescape(text)", "return text", (RQ, "-k", "agnews"),
           "AG News: &amp; &lt; &gt; &quot; kept as text"),
    Mutant("agnews-vocab-ties-unordered", DS + "agnews.py", "key=lambda kv: (-kv[1], kv[0])", "key=lambda kv: -kv[1]",
           (RQ, "-k", "agnews"), "AG News: the vocabulary's ties in first-seen order, not by the token"),
    Mutant("shakespeare-unknown-as-newline", DS + "shakespeare.py",
           "return np.where(codes < 256, _TABLE[np.minimum(codes, 255)], _TABLE[ord(\" \")])",
           "return np.where(codes < 256, _TABLE[np.minimum(codes, 255)], 0)", (RQ, "-k", "shakespeare"),
           "Shakespeare: a character past latin-1 (the ’, an emoji) read as id 0 (newline), not the space"),
    Mutant("shakespeare-latin1-unknown-as-newline", DS + "shakespeare.py",
           "_TABLE = np.full(256, LETTERS.index(\" \"), dtype=np.int64)", "_TABLE = np.full(256, 0, dtype=np.int64)",
           (RQ, "-k", "shakespeare"),
           "Shakespeare: a latin-1 character outside LEAF's alphabet (ù, tab, ~) read as id 0"),
    Mutant("femnist-stats-with-test-rows", DS + "leaf.py", "mean, std = float(trx.mean()), float(trx.std()) or 1.0",
           "mean, std = float(np.concatenate([trx, tex]).mean()), float(trx.std()) or 1.0", (RQ, "-k", "femnist_rows"),
           "FEMNIST: the normalization's mean over the test rows too"),
    Mutant("femnist-nonfinite-accepted", DS + "leaf.py", "if not np.isfinite(x).all():", "if False:",
           (RQ, "-k", "femnist_refuses"), "FEMNIST: a NaN / Infinity pixel read (training to NaN)"),
    Mutant("emnist-untransposed", DS + "idx.py", "trx, tex = trx.transpose(0, 2, 1), tex.transpose(0, 2, 1)",
           "trx, tex = trx, tex", (RQ, "-k", "emnist"), "EMNIST: images left column-major (transposed)"),
    Mutant("emnist-letters-unshifted", DS + "idx.py", "try_, tey = try_ - 1, tey - 1", "try_, tey = try_, tey",
           (RQ, "-k", "emnist"), "EMNIST letters: labels 1..26 kept, not 0..25"),
    Mutant("cache-labels-unchecked", "fedrun/data/cache.py", "if blob is not None and not _labels_fit(blob):",
           "if False:", (RQ, "-k", "cache_file_with_labels"),
           "the data cache serves a file whose labels fall outside its classes"),
]

# issue 47 (items 3 and 5): the round loop's reporter; algorithms found by their module, short targets of before
MUTANTS += [
    Mutant("reporter-estimate-silent", "fedrun/clock.py",
           "for line in clock.tell(self.device_type):", "for line in clock.tell(self.device_type)[:0]:",
           ("tests/test_clock.py",), "RoundReporter: the estimate's line on stderr never printed"),
    Mutant("reporter-rounds-left-off-by-one", "fedrun/clock.py",
           'post["est"] = f"{est.per_round:.2f}s x {est.rounds_left} = {hms(est.left)}"',
           'post["est"] = f"{est.per_round:.2f}s x {est.rounds_left - 1} = {hms(est.left)}"',
           ("tests/test_clock.py",), "RoundReporter: the bar's estimate counts one round too few"),
    Mutant("short-target-kept", "fedrun/algorithms/__init__.py",
           'return target if cls is None else f"{cls.__module__}.{cls.__qualname__}"', "return target",
           ("tests/algorithms/test_discovery.py", "tests/test_resume.py", "-k", "short_targets or the_module_resumes"),
           "module_target: fedrun.algorithms.<Class> not made fedrun.algorithms.<module>.<Class>"),
    Mutant("resume-old-algo-target", "fedrun/run/resume.py",
           'out["algo"] = {**out["algo"], "_target_": module_target(out["algo"]["_target_"])}',
           'out["algo"] = out["algo"]',
           ("tests/test_resume.py", "-k", "the_module_resumes"),
           "resume: a checkpoint from before the yamls named the module is refused as another configuration"),
]

# issue 46 items 2 and 4: runs that trained nothing or a part of the model, unbounded sizes
MUTANTS += [
    Mutant("passes-no-minibatch-accepted", "fedrun/run/spec.py", "    if max(sizes) < k * B:", "    if False:",
           ("tests/test_phases.py", "-k", "refused"), "a round of passes where no client holds a minibatch runs"),
    Mutant("head-steps-tau-accepted", "fedrun/algorithms/checks.py",
           "if local_epochs is not None or 1 <= head_steps < tau:",
           "if local_epochs is not None or 1 <= head_steps <= tau:",
           ("tests/algorithms/test_baselines.py", "-k", "fedrep_or_fedpac"),
           "FedRep/FedPAC: head_steps=tau (no body step)"),
    Mutant("fedala-layer-idx-one-past", "fedrun/algorithms/fedala.py",
           "if self.layer_idx > n:  #", "if self.layer_idx > n + 1:  #",
           ("tests/algorithms/test_mixing.py", "-k", "layer_idx"), "FedALA: layer_idx one past the tensors accepted"),
    Mutant("epochs-draws-uncounted", "fedrun/run/spec.py",
           "    return total, passes if in_passes else step", "    return 0, passes if in_passes else step",
           ("tests/test_cli.py", "-k", "bad_input_gets and local_epochs"),
           "local_epochs skips the round-draw memory check"),
    Mutant("sweep-repeat-accepted", "fedrun/run/checks.py",
           "if any(type(v) is type(w) and v == w for w in values[:i]):", "if False:",
           ("tests/test_cli.py", "-k", "lists_a_value_twice"), "a sweep's seed=0,0 runs the same job twice"),
    Mutant("sweep-kept-config-handed-twice", "fedrun/hydra_compat.py",
           "            cfg = mine.pop(0)[1]\n", "            cfg = mine[0][1]\n",
           ("tests/test_hydra_compat.py", "-k", "launcher_gets"),
           "a sweep job's config composed by the validation handed to two launches (jobs share one config)"),
    Mutant("sweep-kept-config-uncapped", "fedrun/hydra_compat.py",
           "if validating and sum(map(len, kept.values())) < KEEP_COMPOSED:", "if validating:",
           ("tests/test_hydra_compat.py", "-k", "launcher_gets"),
           "every config of a sweep's batch kept for its launcher, however many"),
    Mutant("yaml-values-shared", "fedrun/config.py",
           "    return copy.deepcopy(_cached_yaml(path))", "    return _cached_yaml(path)",
           ("tests/test_hydra_compat.py", "-k", "yaml_values"),
           "yaml_values hands out its cache: a caller's change is every later reader's"),
    Mutant("report-seed-counted-twice", "fedrun/report/jobs.py",
           "            if kept is not j:", "            if False:",
           ("tests/test_report.py", "-k", "seed_found_twice"), "fedrun-report counts a configuration's seed twice"),
    Mutant("agnews-vocab-uncapped", "fedrun/data/datasets/agnews.py",
           "vocab_size=len(vocab) + 2)", "vocab_size=self.vocab_size)",
           ("tests/data/test_more_datasets.py", "-k", "agnews"), "AG News: vocab_size ids on a corpus of fewer tokens"),
    Mutant("checkpoint-shapes-unchecked", "fedrun/run/runner.py",
           "if got is None or tuple(got.shape) != tuple(p.shape):", "if got is None:",
           ("tests/data/test_more_datasets.py", "-k", "checkpoint_of_another"),
           "a checkpoint of another embedding size resumed"),
]

# every method branch by a hand computation (issue 45 items 3 and 5): the follow=paper branches, the
# held-out clients' onboarding, the schedules over rounds, the epochs forms
BY_HAND = "tests/algorithms/test_branches_by_hand.py"
MUTANTS += [
    Mutant("fedamp-paper-pull-sign", "fedrun/algorithms/fedamp.py",
           'g = prox_grad(g, local.params, local.u, self.lam / self.alpha_k)',
           'g = prox_grad(g, local.params, local.u, -self.lam / self.alpha_k)',

           (BY_HAND, "-k", "fedamp"), "FedAMP paper: the pull toward u_i pushes away (sign)"),
    Mutant("fedamp-paper-pull-no-alpha-k", "fedrun/algorithms/fedamp.py",
           'g = prox_grad(g, local.params, local.u, self.lam / self.alpha_k)',
           'g = prox_grad(g, local.params, local.u, self.lam)',
           (BY_HAND, "-k", "fedamp"), "FedAMP paper: the pull's weight lam, not lam / alpha_k"),
    Mutant("fedamp-onboard-no-cloud", "fedrun/algorithms/fedamp.py",
           "local = FedAMPLocal(params=w, u=self.cloud_models(state, w, new))", "local = FedAMPLocal(params=w, u=w)",
           (BY_HAND, "-k", "fedamp"), "FedAMP: a held-out client pulled toward its own model, not its cloud model"),
    Mutant("fedamp-epochs-one-pass", "fedrun/algorithms/fedamp.py",
           "return None if self.local_epochs is None else (Phase(self.client_step, epochs=self.local_epochs),)",
           "return None if self.local_epochs is None else (Phase(self.client_step, epochs=1),)",
           (BY_HAND, "-k", "fedamp and epochs"), "FedAMP: local_epochs ignored (one pass a round)"),
    Mutant("apfl-paper-v-step-unweighted", "fedrun/algorithms/apfl.py",
           "v[k] - self.lr * per_client(local.alpha, v[k]) * gbar[k]",
           "v[k] - self.lr * gbar[k]",
           (BY_HAND, "-k", "apfl"), "APFL paper: v's step on the mixture's gradient without its factor alpha"),
    Mutant("apfl-paper-served-weight-flipped", "fedrun/algorithms/apfl.py",
           'return self._mix(state.clients.v, expand(state.params, alpha.shape[0]), alpha), None',
           'return self._mix(state.clients.v, expand(state.params, alpha.shape[0]), 1 - alpha), None',
           (BY_HAND, "-k", "apfl"), "APFL paper: served (1 - alpha) v + alpha w"),
    Mutant("apfl-onboard-v-initial", "fedrun/algorithms/apfl.py",
           "local = local._replace(params=own(state, local.params, new), v=self.own_models(state, new))",
           "local = local._replace(params=own(state, local.params, new))",
           (BY_HAND, "-k", "apfl"), "APFL: a held-out client's v starts from the initial model, not w^t"),
    Mutant("apple-paper-served-stale-theta", "fedrun/algorithms/apple.py",
           'return self.with_statistics(mix(state.clients.p["p"], state.clients.params), state.clients.theta), None',
           'return state.clients.theta, None',
           (BY_HAND, "-k", "apple"),
           "APPLE paper: served theta_i of the client's last step, not p_i times the new cores"),
    Mutant("apple-decay-off-by-one", "fedrun/algorithms/apple.py",
           "        t = rnd - 2", "        t = rnd - 1",
           (BY_HAND, "-k", "apple"), "APPLE: the cosine decay of lam_t one round early"),
    Mutant("apple-onboard-first-round-lam", "fedrun/algorithms/apple.py",
           "self.lam_at((self.run_rounds or 0) + 1))", "self.lam_at(1))",
           (BY_HAND, "-k", "apple"), "APPLE: a held-out client's p steps with round 1's lam_t, not the next round's"),
    Mutant("fedfomo-paper-base-old", "fedrun/algorithms/fedfomo.py",
           'base = local.old if self.follow == "pfllib" else local.params', "base = local.old",
           (BY_HAND, "-k", "fedfomo"), "FedFomo paper: w_n measured from the model after the last mixture (pfllib's)"),
    Mutant("fedfomo-onboard-step-short", "fedrun/algorithms/fedfomo.py",
           "for s in range(self.val_batches, self.val_batches + steps):",
           "for s in range(self.val_batches + 1, self.val_batches + steps):",
           (BY_HAND, "-k", "fedfomo"), "FedFomo: a held-out client takes one SGD step less than new_client_steps"),
    Mutant("fedproto-branches-swapped", "fedrun/algorithms/fedproto.py",
           'w = counts if self.follow == "paper" else has.to(counts.dtype)',
           'w = counts if self.follow == "pfllib" else has.to(counts.dtype)',
           (BY_HAND, "-k", "fedproto"), "FedProto: paper's row-weighted prototypes and pfllib's unweighted swapped"),
    Mutant("fedpac-paper-heads-transposed", "fedrun/algorithms/fedpac.py",
           "return {k: torch.tensordot(A.to(v.dtype), v, dims=1) for k, v in heads.items()}",
           "return {k: torch.tensordot(A.T.to(v.dtype), v, dims=1) for k, v in heads.items()}",
           (BY_HAND, "-k", "fedpac"), "FedPAC paper: client i's head mixed with column i of A, not row i"),
    Mutant("fedpac-paper-protos-mean-of-sums", "fedrun/algorithms/fedpac.py",
           "return sums.sum(0) / counts.sum(0).clamp(min=1).unsqueeze(-1), present",
           "return sums.mean(0) / counts.sum(0).clamp(min=1).unsqueeze(-1), present",
           (BY_HAND, "-k", "fedpac"), "FedPAC paper: the class sums averaged over clients before dividing by all rows"),
    Mutant("fedpac-steps-head-off-by-one", "fedrun/algorithms/fedpac.py",
           'on_head = local.step < self.head_steps', 'on_head = local.step <= self.head_steps',
           (BY_HAND, "-k", "fedpac and steps"), "FedPAC steps form: head_steps + 1 head steps"),
]

MUTANTS += [
    Mutant("fedphp-mu-schedule-off-by-one", "fedrun/algorithms/fedphp.py",
           "return min(self.mu * (rnd - 1) / T, self.mu)", "return min(self.mu * rnd / T, self.mu)",
           (BY_HAND, "-k", "fedphp"), "FedPHP: mu_t = mu t / T, not mu (t - 1) / T (the history weighs from round 1)"),
    Mutant("fedphp-mu-rounds-ignored", "fedrun/algorithms/fedphp.py",
           "T = self.mu_rounds or self.run_rounds", "T = self.run_rounds",
           (BY_HAND, "-k", "fedphp"), "FedPHP: mu_rounds ignored (T the run's rounds)"),
    Mutant("fedphp-onboard-next-round-mu", "fedrun/algorithms/fedphp.py",
           "local = self.client_init(state, new, 1)", "local = self.client_init(state, new, 2)",
           (BY_HAND, "-k", "fedphp"), "FedPHP: a held-out client's v_i keeps part of the initial model (mu_2, not 0)"),
    Mutant("fedala-start-phase-every-round", "fedrun/algorithms/fedala.py",
           'start = active & ~state.clients.ala["started"][clients]', "start = active",
           (BY_HAND, "-k", "fedala"), "FedALA: the start phase's extra ALA passes every round, not the first ALA only"),
    Mutant("fedala-start-steps-short", "fedrun/algorithms/fedala.py",
           "ala += (Phase(self.ala_start_step, steps=(self.start_epochs - 1) * self.ala_steps),)",
           "ala += (Phase(self.ala_start_step, steps=(self.start_epochs - 2) * self.ala_steps),)",
           (BY_HAND, "-k", "fedala and steps"), "FedALA (ala_steps set): the first ALA one pass short"),
    Mutant("fedala-start-epochs-long", "fedrun/algorithms/fedala.py",
           "ala += (Phase(self.ala_start_step, epochs=self.start_epochs - 1),)",
           "ala += (Phase(self.ala_start_step, epochs=self.start_epochs),)",
           (BY_HAND, "-k", "fedala and epochs"), "FedALA (ala_steps null): the first ALA one pass too many"),
    Mutant("fedrod-onboard-steps-ignored", "fedrun/algorithms/fedrod.py",
           "for batches in onboarding_batches(ctx, new, self.new_client_steps):",
           "for batches in onboarding_batches(ctx, new, None):",
           (BY_HAND, "-k", "fedrod"), "FedRoD: a held-out client's new_client_steps ignored (tau steps)"),
    Mutant("fedrod-unbalanced", "fedrun/algorithms/fedrod.py",
           "balanced = engine.criterion(logits + counts.log(), y)", "balanced = engine.criterion(logits, y)",
           (BY_HAND, "-k", "fedrod"), "FedRoD: the generic model on plain cross-entropy, not the balanced softmax"),
    Mutant("gpfl-conditions-from-trained-gce", "fedrun/algorithms/gpfl.py",
           'cond_g, cond_p = conditions(local.emb, local.counts)',
           'cond_g, cond_p = conditions(local.gce["e"], local.counts)',
           (BY_HAND, "-k", "gpfl"), "GPFL: the step's conditions from the GCE as it trains, not the received one"),
    Mutant("gpfl-gce-no-weight-decay", "fedrun/algorithms/gpfl.py",
           'gce=sub(local.gce, scale(ggce, lr))', 'gce=sub(local.gce, scale({"e": g["gce"]}, lr))',
           (BY_HAND, "-k", "gpfl"), "GPFL: the GCE's step without its weight decay mu"),
    Mutant("fedcp-upload-global-head", "fedrun/algorithms/fedcp.py",
           'upload = add(scale(mine, 0.5), scale(local.head_g, 0.5))',
           'upload = add(scale(mine, 0.5), scale(state.extra["head_g"], 0.5))',
           (BY_HAND, "-k", "fedcp"), "FedCP pfllib: the uploaded head averaged with the server's head_g, not the "
                                     "client's own copy"),
    Mutant("fedcp-mmd-to-itself", "fedrun/algorithms/fedcp.py",
           "feat0 = engine.features({**base, head[0]: model[head[0]], head[1]: model[head[1]]}, x)",
           "feat0 = engine.features(model, x)",
           (BY_HAND, "-k", "fedcp"), "FedCP: the MMD against the trained body's features, not the received body's"),
    Mutant("loop-vag-clients-from-args", "fedrun/engine/loop.py",
           "each client's entries, as vmap gives them)\n        for i in range(len(next(iter(params.values())))):",
           "each client's entries, as vmap gives them)\n        for i in range(len(args[0])):",
           (BY_HAND, "-k", "gpfl and Loop"), "LoopEngine.value_and_grad counts clients by its first argument "
                                             "(GPFL's onboarding: a dict)"),
]

MUTANTS += [
    Mutant("apple-local-epochs-ignored", "fedrun/algorithms/apple.py",
           "return None if self.local_epochs is None else (Phase(self.client_step, epochs=self.local_epochs),)",
           "return None",
           (BY_HAND, "-k", "apple and epochs"), "APPLE: local_epochs ignored (tau steps a round)"),
    Mutant("fedcp-epochs-one-pass", "fedrun/algorithms/fedcp.py",
           "return (Phase(self.train_step, epochs=self.local_epochs),)", "return (Phase(self.train_step, epochs=1),)",
           (BY_HAND, "-k", "fedcp and epochs"), "FedCP: local_epochs ignored (one pass a round)"),
]

MUTANTS += [
    Mutant("ditto-onboard-global-lr", "fedrun/algorithms/ditto.py",
           "x, y)\n        gv = prox_grad(gv, local.personal, local.anchor, self.lam)\n"
           "        return self.descend(local, \"personal\", gv, self.personal_lr, rnd)",
           "x, y)\n        gv = prox_grad(gv, local.personal, local.anchor, self.lam)\n"
           "        return self.descend(local, \"personal\", gv, self.lr, rnd)",
           (BY_HAND, "-k", "held_out_client_by_hand and ditto"), "Ditto: a held-out client's personal steps of lr, "
                                                                  "not personal_lr"),
    Mutant("bodyhead-onboard-fits-shared-part", "fedrun/algorithms/bodyhead.py",
           "names = param_names(part)", "names = [k for k in param_names(local.params) if k not in part]",
           (BY_HAND, "-k", "held_out_client_by_hand"), "FedPer/LG-FedAvg/FedRep/FedPAC: a held-out client fits the "
                                                       "shared part, its own part frozen"),
]


# issue 45 item 1: every model against a reference with copied weights (tests/models/test_models_reference.py)
MODEL_REF = "tests/models/test_models_reference.py"
RESNET, RNN, TEXT, SMALL = ("fedrun/models/resnet.py", "fedrun/models/rnn.py", "fedrun/models/text.py",
                            "fedrun/models/small.py")
MUTANTS += [
    Mutant("resnet-shortcut-dropped", RESNET, "return self.relu(self.norm2(self.conv2(out)) + self.shortcut(x))",
           "return self.relu(self.norm2(self.conv2(out)))", (MODEL_REF, "-k", "resnet"),
           "ResNet's BasicBlock without its residual connection"),
    Mutant("resnet-relu-before-add", RESNET, "return self.relu(self.norm2(self.conv2(out)) + self.shortcut(x))",
           "return self.relu(self.norm2(self.conv2(out))) + self.shortcut(x)", (MODEL_REF, "-k", "resnet"),
           "ResNet's BasicBlock: the ReLU before the residual sum, not after"),
    Mutant("resnet-max-pool", RESNET, ".mean((2, 3))", ".amax((2, 3))", (MODEL_REF, "-k", "resnet"),
           "ResNet: global max pooling instead of average pooling"),
    Mutant("resnet-bn-momentum", RESNET, "return nn.BatchNorm2d(channels)",
           "return nn.BatchNorm2d(channels, momentum=0.01)",
           (MODEL_REF, "-k", "resnet"), "ResNet's BatchNorm with momentum 0.01 (torch's and the paper's: 0.1)"),
    Mutant("resnet-gn-one-group", RESNET, "return nn.GroupNorm(groups, channels)", "return nn.GroupNorm(1, channels)",
           (MODEL_REF, "-k", "resnet"), "ResNet norm=gn: one group per layer whatever model.groups says"),
    Mutant("resnet-stem-relu-dropped", RESNET, "_norm(norm, width, groups), nn.ReLU())", "_norm(norm, width, groups))",
           (MODEL_REF, "-k", "resnet"), "ResNet's stem without its ReLU"),
    Mutant("lstm-first-step", RNN, "h = lstm_layers(self.lstm, self.embedding(x))[:, -1]",
           "h = lstm_layers(self.lstm, self.embedding(x))[:, 0]", (MODEL_REF, "-k", "lstm"),
           "LSTM: the head on the first step's output, not the last"),
    Mutant("lstm-gate-order", RNN, "i, f, g, o = (xs[:, t]", "i, g, f, o = (xs[:, t]", (MODEL_REF, "-k", "lstm"),
           "LSTM: the gates read in the order i, g, f, o (nn.LSTM's is i, f, g, o)"),
    Mutant("lstm-hh-bias-dropped", RNN,
           'xs = xs + (getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}"))',
           'xs = xs + getattr(lstm, f"bias_ih_l{layer}")', (MODEL_REF, "-k", "lstm"),
           "LSTM: the hidden-to-hidden bias left out"),
    Mutant("transformer-mask-not-passed", TEXT, "h = layer(h, pad)", "h = layer(h, torch.zeros_like(pad))",
           (MODEL_REF, "-k", "transformer"), "Transformer: the key padding mask not passed (padding attended to)"),
    Mutant("transformer-mean-over-padding", TEXT, "h = _mean_tokens(h, x) if self.pool", "h = h.mean(1) if self.pool",
           (MODEL_REF, "-k", "transformer"), "Transformer pool=mean: the mean over all positions, padding included"),
    Mutant("transformer-attention-scale", TEXT, "/ math.sqrt(d // self.heads)", "/ math.sqrt(d)",
           (MODEL_REF, "-k", "transformer"), "Transformer: scores scaled by sqrt(dim), not sqrt(head dim)"),
    Mutant("transformer-positions-swapped", TEXT, "torch.stack([torch.sin(pos * freq), torch.cos(pos * freq)], -1)",
           "torch.stack([torch.cos(pos * freq), torch.sin(pos * freq)], -1)", (MODEL_REF, "-k", "transformer"),
           "Transformer: cos at the even position features, sin at the odd"),
    Mutant("textcnn-mean-pool", TEXT, "F.relu(conv(e)).amax(-1)", "F.relu(conv(e)).mean(-1)",
           (MODEL_REF, "-k", "textcnn"), "TextCNN: mean over time instead of max"),
    Mutant("fasttext-mean-over-padding", TEXT, "self.hidden(_mean_tokens(_embed(self.embedding, x), x))",
           "self.hidden(_embed(self.embedding, x).mean(1))", (MODEL_REF, "-k", "fasttext"),
           "fastText: the mean embedding over all positions, padding included"),
    Mutant("cnn-flatten-channels-last", SMALL,
           "x = self._images(x, x.shape[0])\n        return _outputs(self.hidden(self.conv(x).flatten(1))",
           "x = self._images(x, x.shape[0])\n        return _outputs(self.hidden("
           "self.conv(x).permute(0, 2, 3, 1).flatten(1))",
           (MODEL_REF, "-k", "cnn"), "CNN: the feature maps flattened in H, W, C order (the authors' view is C, H, W)"),
    Mutant("fedavg-cnn-hidden-relu-dropped", SMALL,
           "self.hidden = nn.Sequential(nn.Linear(64 * side * side, 512), nn.ReLU())",
           "self.hidden = nn.Sequential(nn.Linear(64 * side * side, 512))", (MODEL_REF, "-k", "fedavg_cnn"),
           "FedAvgCNN: no ReLU after the 512-wide layer"),
    Mutant("fedavg-cnn-avg-pool", SMALL, "nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),",
           "nn.Conv2d(32, 64, 5), nn.ReLU(), nn.AvgPool2d(2),", (MODEL_REF, "-k", "fedavg_cnn"),
           "FedAvgCNN: average pooling after the second convolution, not max"),
    Mutant("cnn-bn-relu-before-bn", SMALL,
           "nn.Conv2d(in_channels, 64, 5), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),",
           "nn.Conv2d(in_channels, 64, 5), nn.ReLU(), nn.BatchNorm2d(64), nn.MaxPool2d(2),",
           (MODEL_REF, "-k", "cnn_bn"),
           "CNNBN: conv-ReLU-BN, not FedBN's conv-BN-ReLU"),
    Mutant("mlp-bn-after-activation", SMALL,
           "layers += [nn.Linear(width, h), *([nn.BatchNorm1d(h)] if batchnorm else []), ACTIVATIONS[activation]()]",
           "layers += [nn.Linear(width, h), ACTIVATIONS[activation](), *([nn.BatchNorm1d(h)] if batchnorm else [])]",
           (MODEL_REF, "-k", "mlp_bn"), "MLPBN: Linear-activation-BN, not Linear-BN-activation"),
    Mutant("elu-hand-grad", SMALL, "return torch.where(out > 0, grad, grad * (out + 1))",
           "return torch.where(out > 0, grad, grad * out)", (MODEL_REF, "-k", "fast_paths"),
           "the hand-written backward: ELU's derivative below 0 taken as out, not out + 1"),
    Mutant("weighted-ce-loss-mean", SMALL, "losses = (nll * weight).sum(1)", "losses = (nll * weight).mean(1)",
           (MODEL_REF, "-k", "fast_paths"), "the hand-written backward's weighted losses averaged, not summed"),
]

# issue 45 item 4: the resume fingerprint by construction, precision by the dtype of the steps' products
FP = "tests/test_fingerprint.py"
MUTANTS += [
    Mutant("fingerprint-gamma-step-only", "fedrun/algorithms/optim.py",
           '"gamma": (lambda o: o.schedule in ("step", "exponential"),', '"gamma": (lambda o: o.schedule == "step",',
           (FP, "-k", "optim"), "fingerprint: optim.gamma left out under the exponential schedule"),
    Mutant("fingerprint-state-adam-only", "fedrun/algorithms/optim.py", '"state": (lambda o: o.stateful,',
           '"state": (lambda o: o.name != "sgd",', (FP, "-k", "optim"),
           "fingerprint: optim.state left out for SGD with momentum"),
    Mutant("fingerprint-drops-weight-decay", "fedrun/algorithms/optim.py",
           "if k not in READ_ONLY_BY or READ_ONLY_BY[k][0](opt)}",
           'if k != "weight_decay" and (k not in READ_ONLY_BY or READ_ONLY_BY[k][0](opt))}', (FP, "-k", "optim"),
           "fingerprint: optim.weight_decay never in it"),
    Mutant("fingerprint-precision-resumable", "fedrun/run/resume.py",
           'RESUMABLE_CHANGES = (*NEUTRAL_OPTIONS, "rounds")',
           'RESUMABLE_CHANGES = (*NEUTRAL_OPTIONS, "rounds", "precision")', (FP, "-k", "precision"),
           "a run resumes under another precision"),
    Mutant("fingerprint-finetune-lr-resumable", "fedrun/run/resume.py",
           'RESUMABLE_CHANGES = (*NEUTRAL_OPTIONS, "rounds")',
           'RESUMABLE_CHANGES = (*NEUTRAL_OPTIONS, "rounds", "algo.finetune_lr")', (FP, "-k", "algorithm"),
           "a run resumes with another algo.finetune_lr (the test-time steps' lr)"),
    Mutant("precision-fp16", "fedrun/run/acceleration.py", "with torch.autocast(device.type, dtype=torch.bfloat16):",
           "with torch.autocast(device.type, dtype=torch.float16):", (FP, "-k", "bf16"),
           "precision=bf16 autocasts to float16"),
]

# figures and the smaller traps of issue 46 (items 7, 8)
FIG_SUMMARY = ("tests/test_report.py::"
               "test_summary_figure_names_methods_holds_its_bands_and_shows_a_method_evaluated_once")
MUTANTS += [
    Mutant("plots-bands-cut-off", "fedrun/plots.py",
           'fit_ylim(ax, [c["mean"] for c in curves.values()], spreads=[c["std"] for c in curves.values()])',
           'fit_ylim(ax, [c["mean"] for c in curves.values()])',
           (FIG_SUMMARY,), "summary.png: the y-axis fitted to the means only, cutting off the +- std bands"),
    Mutant("plots-evaluated-once-bare-dot", "fedrun/plots.py",
           "if mean.notna().sum() == 1:", "if False:",
           (FIG_SUMMARY,), "summary.png: a configuration evaluated once drawn as a one-point line (a bare dot)"),
    Mutant("plots-no-unseen-curves", "fedrun/plots.py",
           'if f"new_{prefix}_acc" in df and', 'if False and f"new_{prefix}_acc" in df and',
           ("tests/test_run_folder.py::test_metrics_png_names_dataset_and_partition_and_draws_the_unseen_clients",),
           "metrics.png: the unseen clients' curves left out"),
    Mutant("report-legend-method-defaults", "fedrun/report/figure.py",
           "if len({repr(p.get(o, missing)) for p in peers}) < 2:", "if False:",
           ("tests/test_report.py::"
            "test_legend_of_one_method_s_options_across_methods_names_the_method_and_what_differs",),
           "summary.png legend: each method's own defaults listed as differences"),
    Mutant("report-unreadable-never-started", "fedrun/report/jobs.py",
           'job.num = _folder_num(path, None if name == "hydra.yaml" else hydra_yaml)', "job.num = None",
           ("tests/test_run_folder.py::test_report_says_a_job_s_config_is_unreadable_not_that_it_never_started",),
           "fedrun-report: a job with an unreadable config also listed as never started"),
    Mutant("refusal-keeps-lock", "fedrun/run/folder.py",
           "(self.own_lock_file or os.listdir", "(os.listdir",
           ("tests/test_run_folder.py::"
            "test_a_refusal_in_a_folder_of_files_leaves_no_lock_and_a_finished_run_s_lock_stays",),
           "a refused run leaves its .lock in a folder holding other files"),
    Mutant("tf32-on-cpu-silent", "fedrun/run/acceleration.py",
           'if precision == "tf32" and torch.device(device).type != "cuda":', "if False:",
           ("tests/test_acceleration.py::test_precision_on_the_cpu_says_what_it_does",),
           "precision=tf32 on the CPU runs fp32 silently"),
]

# issue 46: a batched group's seeds stop and resume at one round; the baseline table takes any model
BATCHED = "tests/test_batched.py"
MUTANTS += [
    Mutant("group-round-interruptible", "fedrun/simulate.py",
           "with _signals_held(len(active) > 1):", "with _signals_held(False):",
           (BATCHED, "-k", "ctrl_c"), "a Ctrl-C inside a round's per-seed finish stops the seeds at different rounds"),
    Mutant("group-checkpoint-own-clock", "fedrun/simulate.py",
           "or any(r.checkpoint_due is not None and r.checkpoint_due() for r in finished)",
           "or all(r.checkpoint_due is not None and r.checkpoint_due() for r in finished)",
           (BATCHED, "-k", "same_rounds"), "a time-based checkpoint due for one seed is not the group's"),
    Mutant("group-resume-own-rounds", "fedrun/run/runner.py",
           "    if common == max(rounds):\n", "    if True:\n",
           (BATCHED, "-k", "common_round"), "seeds a kill left at different rounds resume from their own"),
    Mutant("baselines-setting-options-kept", "scripts/baselines.py",
           "if takes is None or option.split(\".\")[0] in takes:", "if True:",
           ("tests/test_scripts.py", "-k", "another_model"),
           "baselines.py passes the setting's model/partition options to a model or partition that has none such"),
    # issue 47 item 6: the paper scripts' --launcher, checked by the (cheaper) batched-vs-basic scripts test
    Mutant("paper-launcher-ignored", "scripts/_paper.py",
           'f"hydra/launcher={args.launcher}"', '"hydra/launcher=batched"',
           ("tests/test_scripts.py::test_paper_scripts_batch_seeds_by_default_and_match_the_basic_launcher",),
           "the paper scripts' --launcher basic still runs the batched launcher"),
    Mutant("pflscaf-one-model-per-round", "fedrun/algorithms/pflscaf.py",
           "    models_per_round = 2\n", "    models_per_round = 1\n",
           ("tests/test_scripts.py::test_pfl_cifar_quick_runs_every_paper_method",),
           "PFLScaf counts one model a client a round (paper 004: its model and its control variate, 2)"),
    Mutant("pfl-gain-bound-swapped", "fedrun/report/stats.py",
           '        return base_at_least / mean, ">"', '        return base_at_least / mean, "<"',
           ("tests/test_scripts.py::test_pfl_cifar_quick_table_figure_and_replot",),
           "paper 004's gain when only the method reached the target is marked an upper bound, not a lower one"),
    Mutant("sampling-null-not-replacement", "fedrun/run/spec.py",
           'sampling=cfg.get("sampling") or "replacement",', 'sampling=cfg.get("sampling") or "epochs",',
           ("tests/test_sampling.py::test_the_option_reaches_the_run",),
           "sampling=null (and the default) draws as epochs, not with replacement"),
    Mutant("baselines-best-is-last", "scripts/baselines.py",
           "best.append(100 * float(m[col].max()))", "best.append(100 * float(m[col].iloc[-1]))",
           ("tests/test_scripts.py", "-k", "baselines_quick_table or keeps_held_out"),
           "baselines.py's best round is the last round's accuracy"),
    Mutant("baselines-last-is-first", "scripts/baselines.py",
           "last.append(100 * float(m[col].iloc[-1]))", "last.append(100 * float(m[col].iloc[0]))",
           ("tests/test_scripts.py", "-k", "baselines_quick_table or keeps_held_out"),
           "baselines.py's last round is the first round's accuracy"),
    Mutant("table1-honest-reads-official", "scripts/pfedme_table1.py",
           'same = proto == "official_2020" and algo != "perfedavg"',
           'same = proto != "official" and algo != "perfedavg"',
           ("tests/test_scripts.py::test_pfedme_table1_quick",),
           "pfedme_table1.py's honest columns of FedAvg and pFedMe show the official runs' numbers"),
]
MUTANTS += [
    Mutant("lstm-hand-forget-grad", "fedrun/models/rnn.py",
           "torch.mul(dc * c_prev, f * (1 - f), out=df)", "torch.mul(dc * c_prev, f * (1 + f), out=df)",
           ("tests/models/test_models.py", "-k", "lstm_hand_backward"),
           "the LSTM's hand-written backward: a wrong forget-gate derivative"),
    Mutant("lstm-hand-hh-shift", "fedrun/models/rnn.py",
           "outs.new_zeros(m, b, 1, hid), outs[:, :, :-1]]", "outs[:, :, :1], outs[:, :, :-1]]",
           ("tests/models/test_models.py", "-k", "lstm_hand_backward"),
           "the LSTM's hand-written backward: W_hh's gradient pairs step 0 with h_0 instead of the zero state"),
    Mutant("lstm-fused-unweighted", "fedrun/models/rnn.py",
           "loss = rows.mean() if weight is None else (rows * weight[i]).sum()", "loss = rows.mean()",
           ("tests/models/test_models.py", "-k", "lstm"),
           "the LSTM's fused per-client gradients: full passes' row weights (padding masks) ignored"),
]
TRAINER = "tests/algorithms/test_trainer.py"
FT_BY_WORK = "tests/algorithms/test_baselines.py::test_finetune_epochs_by_work_equals_the_masked_fine_tuning"
MUTANTS += [
    Mutant("passes-disjoint-rows-ignored", "fedrun/run/spec.py",
           "k = max(ph.batches if ph.disjoint else 1 for ph in phases if ph.epochs is not None)", "k = 1",
           ("tests/test_phases.py", "-k", "per_fedavg"),
           "Per-FedAvg in epochs: a run whose clients hold fewer than 2 x batch_size rows accepted, training nothing"),
    Mutant("epochs-disjoint-ignored", "fedrun/simulate.py",
           "per_pass = sizes // (k * B if ph.disjoint else B)", "per_pass = sizes // B",
           (TRAINER, "-k", "disjoint"),
           "Per-FedAvg's epochs: a pass of floor(n_c / B) meta-steps, twice PFLlib's (rows repeat within it)"),
    Mutant("epochs-by-work-one-client-too-many", "fedrun/engine/work.py",
           "lives = [sum(1 for c in counts if c > s)", "lives = [sum(1 for c in counts if c >= s)",
           (TRAINER, "-k", "by_work"),
           "local epochs by work: a client whose pass is over still steps once more"),
    Mutant("by-work-order-not-restored", "fedrun/engine/work.py",
           "    return clients_at(state, inverse)", "    return state",
           (FT_BY_WORK,), "steps by work (local epochs, fine-tuning in epochs): the clients left sorted by their "
                          "steps, not put back in their order"),
    Mutant("by-work-last-step-dropped", "fedrun/engine/work.py",
           "lives = [sum(1 for c in counts if c > s)", "lives = [sum(1 for c in counts if c > s + 1)",
           (FT_BY_WORK,), "steps by work: each client leaves the prefix one step early (its last step of a pass "
                          "not computed)"),
    Mutant("finetune-epochs-bn-stats-dropped", "fedrun/algorithms/personalize.py",
           "for k in g}, **buffers}", "for k in g}}",
           (FT_BY_WORK,), "fine-tuning in epochs of a BatchNorm model: its running statistics not updated"),
    Mutant("trainer-descend-drops-state", "fedrun/algorithms/trainer.py",
           "        return out._replace(opt={**out.opt, slot: state}) if state else out\n", "        return out\n",
           (TRAINER, "-k", "torch_optims and momentum_wd"),
           "the local trainer loses a model's optimizer state between its steps (momentum restarts every step)"),
    Mutant("trainer-grad-drops-buffers", "fedrun/algorithms/trainer.py",
           "return g, loss, (local._replace(**{key: {**getattr(local, key), **buffers}}) if buffers else local)",
           "return g, loss, local",
           (TRAINER, "-k", "batchnorm"),
           "the local trainer drops a BatchNorm model's updated running statistics"),
    Mutant("trainer-bn-train-mode-off", "fedrun/engine/base.py",
           "        return self.train_grad(params, buffers, x, y)\n",
           "        return (*self.grad({**params, **buffers}, x, y), buffers)\n",
           (TRAINER, "-k", "batchnorm"),
           "a BatchNorm model's local steps in eval mode (running statistics instead of the batch's)"),
]
TYPED = "tests/algorithms/test_typed_state.py"
MUTANTS += [  # issue 44 item 1: the typed contract only, a user's dict state refused before any work (base.check_typed)
    Mutant("typed-check-skipped", "fedrun/run/spec.py",
           "        check_typed(algo, params_of(model))", "        pass",
           (TYPED, "-k", "dict_local_stops"), "a user's dict Local runs into the loop (a traceback, its folder made)"),
    Mutant("typed-check-local-unchecked", "fedrun/algorithms/base.py",
           '    if not _typed(local) or "opt" not in local._fields:', "    if False:",
           (TYPED, "-k", "untyped_state"), "client_init's dict Local (or one without opt) accepted"),
    Mutant("typed-check-local-opt-unchecked", "fedrun/algorithms/base.py",
           '    if not _typed(local) or "opt" not in local._fields:', "    if not _typed(local):",
           (TYPED, "-k", "untyped_state"), "a NamedTuple Local without the trainer's opt field accepted"),
    Mutant("typed-check-clients-dict-accepted", "fedrun/algorithms/base.py",
           "        if not _typed(state.clients):", "        if False:",
           (TYPED, "-k", "untyped_state"), "a dict ServerState.clients not named as such (told to declare Clients)"),
    Mutant("typed-check-clients-type-unchecked", "fedrun/algorithms/base.py",
           "        if kind is not algo.Clients:", "        if False:",
           (TYPED, "-k", "untyped_state"), "typed clients of a type the class does not declare (would not resume)"),
    Mutant("typed-check-shifts-rng", "fedrun/algorithms/base.py",
           "    with torch.random.fork_rng(devices=[]):", "    with torch.no_grad():",
           (TYPED, "-k", "random_stream"), "the check's hooks draw from the run's random stream"),
    Mutant("trainer-persist-rows-unscattered", "fedrun/algorithms/trainer.py",
           "lambda v, rows: v.index_copy(0, clients, rows.to(v.dtype))", "lambda v, rows: v",
           ("tests/algorithms/test_optim.py", "-k", "torch_optimizer_on_its_own and momentum and Vmap"),
           "optim.state=persist: the trained clients' optimizer state not kept"),
    Mutant("trainer-persist-rows-restarted", "fedrun/algorithms/trainer.py",
           "slots[slot] = tree_map(lambda v: v[clients], kept)",
           "slots[slot] = tree_map(lambda v: 0 * v[clients], kept)",
           ("tests/algorithms/test_optim.py", "-k", "torch_optimizer_on_its_own and momentum and Vmap"),
           "optim.state=persist: a round's clients start from zeroed optimizer state, not their kept rows"),
    Mutant("trainer-live-state-unmasked", "fedrun/algorithms/trainer.py",
           "                new_state = _where(live, new_state, state)\n", "                pass\n",
           (TRAINER, "-k", "torch_optims and fedrep and momentum_wd"),
           "a masked step (FedRep's head or body phase) moves the optimizer state of the clients it leaves out"),
]
BN_TRACES = ("tests/test_golden_pfllib_bn.py", "-k", "local_replays and vmap")  # FedAvg's, Ditto's, FedRep's
MUTANTS += [
    Mutant("bn-local-gather-skipped", "fedrun/algorithms/trainer.py",
           '            local = self.with_shared_buffers(local, gather(own, clients))\n',
           "            pass\n", BN_TRACES,
           "bn=local: a round's clients start from the server's statistics, not their own kept ones"),
    Mutant("bn-local-scatter-skipped", "fedrun/algorithms/trainer.py",
           'kept["bn_local"] = scatter(full, clients, buffers)', 'kept["bn_local"] = full', BN_TRACES,
           "bn=local: the trained clients' statistics are not kept (every round from the initial model's)"),
    Mutant("bn-local-server-last-client-trace", "fedrun/algorithms/trainer.py",
           "first = {k: v[selected[0]] for k, v in buffers.items()}",
           "first = {k: v[selected[-1]] for k, v in buffers.items()}", BN_TRACES,
           "bn=local: the server's statistics from the last aggregated client instead of the first"),
    Mutant("fedavg-bn-local-averaged", "fedrun/algorithms/batchnorm.py",
           '        return _buffers(local)\n', "        return {}\n", BN_TRACES,
           "FedAvg under bn=local: the clients' statistics averaged by the server (bn=local ignored)"),
    Mutant("fedavg-bn-local-server-averaged", "fedrun/algorithms/batchnorm.py",
           '        return ServerState(params=state.params, extra={**state.extra, "buffers": buffers}, '
           'clients=state.clients)\n', "        return state\n", BN_TRACES,
           "FedAvg under bn=local: the server's model keeps the averaged statistics, not its first client's"),
    Mutant("fedrep-head-steps-stats-dropped", "fedrun/algorithms/fedrep.py",
           '        g, _, local = self.grad(engine, local, "params", x, y)\n        p = local.params\n',
           '        g, _, stepped = self.grad(engine, local, "params", x, y)\n'
           '        local = local if bool((step < self.head_steps).all()) else stepped\n        p = local.params\n',
           ("tests/test_golden_pfllib_bn.py", "-k", "local_replays and fedrep"),
           "FedRep: the head steps' forward leaves the running statistics (PFLlib's head epochs run in train mode)"),
]

PLAN_TEST = ("tests/test_scripts.py", "-k", "plan_times")
MUTANTS += [
    Mutant("baselines-plan-one-seed", "scripts/baselines.py",
           "proj = n * (rounds * s_round + evals * s_eval)", "proj = rounds * s_round + evals * s_eval",
           PLAN_TEST, "baselines.py --plan projects one seed's time for the table's seeds"),
    Mutant("baselines-plan-no-evaluation", "scripts/baselines.py",
           "proj = n * (rounds * s_round + evals * s_eval)", "proj = n * rounds * s_round",
           PLAN_TEST, "baselines.py --plan leaves the evaluations out of the projection"),
    Mutant("baselines-plan-missing-data-refused", "scripts/baselines.py",
           "if isinstance(err, DataMissingError) or isinstance(err.__cause__, DataMissingError):",
           "if isinstance(err, DataMissingError):",
           PLAN_TEST, "baselines.py --plan lists missing files as every entry's refusal, not one line, exit 2"),
]

SBS_PAIR = ("tests/test_side_by_side.py", "-k", "rounds_pair or bad_options")
MUTANTS += [  # pfllib_side_by_side.py --rounds-pair: seconds per round with the fixed costs out (issue 44 item 4)
    Mutant("sbs-pair-totals-not-per-run", "scripts/pfllib_side_by_side.py",
           'slope = (b[key] / b["runs"] - a[key] / a["runs"]) / (r2 - r1)', "slope = (b[key] - a[key]) / (r2 - r1)",
           SBS_PAIR, "--rounds-pair's s/round from all runs' totals, not per run (PFLlib's seeds are one run each)"),
    Mutant("sbs-pair-fixed-part", "scripts/pfllib_side_by_side.py",
           'return slope, a[key] / a["runs"] - r1 * slope', 'return slope, a[key] / a["runs"]',
           SBS_PAIR, "--rounds-pair's fixed part keeps R1's rounds"),
    Mutant("bench-epochs-counts-masked-steps", "fedrun/bench/epochs.py",
           "work += sum(int(d.live.sum()) if d.live is not None else",
           "work += sum(d.idx.shape[0] * d.idx.shape[1] if d.live is not None else",
           ["tests/test_bench.py::test_epochs_bench_counts_each_clients_epoch_and_the_steps_round_does_as_much"],
           "fedrun-bench --epochs counts the masked steps as the epoch round's work (the steps round then too long)"),
    Mutant("sbs-pair-any-counts", "scripts/pfllib_side_by_side.py",
           "if len(pair) != 2 or not 1 <= pair[0] < pair[1]:", "if len(pair) != 2:",
           SBS_PAIR, "--rounds-pair takes R1 >= R2 or 0 rounds"),
    Mutant("sbs-pair-masked-left-out", "scripts/pfllib_side_by_side.py",
           'r["pair"] = {side: {} for side in ("fedrun", "pfllib") + (("fedrun_masked",) if args.fedrun_masked',
           'r["pair"] = {side: {} for side in ("fedrun", "pfllib") + (("fedrun_masked",) if False',
           SBS_PAIR, "--rounds-pair leaves --fedrun-masked's side out"),
    Mutant("sbs-pair-reruns-at-rounds", "scripts/pfllib_side_by_side.py",
           "again = n != args.rounds", "again = True",
           SBS_PAIR, "--rounds-pair runs the count equal to --rounds again instead of reusing that run"),
]


PFLGROUP = "tests/algorithms/test_trainer_pflgroup.py"
MUTANTS += [  # the local trainer for FedALA, FedFomo, APPLE, FedCP, GPFL, FedPAC (issue 44)
    Mutant("fedfomo-distance-over-buffers", "fedrun/algorithms/fedfomo.py",
           "names = param_names(base)  # the distance", "names = list(base)  # the distance",
           (PFLGROUP, "-k", "fedfomo_weighs"), "FedFomo: distances and the mixture over running statistics too"),
    Mutant("fedfomo-local-epochs-ignored", "fedrun/algorithms/fedfomo.py",
           "epochs=self.local_epochs) if self.local_epochs is not None", "epochs=self.local_epochs) if False",
           (PFLGROUP, "-k", "fedfomo_local_epochs"), "FedFomo: algo.local_epochs ignored (tau steps)"),
    Mutant("fedala-mixes-buffers", "fedrun/algorithms/fedala.py",
           "names = param_names(params)\n        return names[-self.layer_idx:]",
           "names = list(params)\n        return names[-self.layer_idx:]",
           (PFLGROUP, "-k", "fedala_mixes"), "FedALA: W over running statistics too"),
    Mutant("apple-p-held-out-columns-move", "fedrun/algorithms/apple.py",
           '{"p": torch.where(local.member, grad, 0)}', '{"p": grad}',
           (PFLGROUP, "-k", "apple"), "APPLE: p's held-out columns take optimizer steps"),
    Mutant("apple-core-gradient-unscaled", "fedrun/algorithms/apple.py",
           'self.descend(local, "params", scale(g, pii), self.lr, rnd)',
           'self.descend(local, "params", g, self.lr, rnd)',
           (PFLGROUP, "-k", "apple"), "APPLE: the core's optimizer gradient without p_ii C"),
    Mutant("fedcp-cpn-skips-optimizer", "fedrun/algorithms/fedcp.py",
           'local = self.descend(local, "cpn", gc, lr, rnd)',
           'local = local._replace(cpn=sub(local.cpn, scale(gc, lr)))',
           (PFLGROUP, "-k", "fedcp"), "FedCP: the CPN takes plain SGD under optim.*"),
    Mutant("gpfl-gce-mu-dropped", "fedrun/algorithms/gpfl.py",
           'return self.descend(local, "gce", ggce, lr, rnd)',
           'return self.descend(local, "gce", {"e": g["gce"]}, lr, rnd)',
           (PFLGROUP, "-k", "gpfl"), "GPFL: the GCE's weight decay mu dropped under optim.*"),
    Mutant("fedpac-head-in-body-slot", "fedrun/algorithms/fedpac.py",
           'names=head_names(g), slot="opt.head")', "names=head_names(g))",
           (PFLGROUP, "-k", "fedpac"), "FedPAC: the head's steps in the body's optimizer slot"),
]

BODYHEAD = "tests/algorithms/test_trainer_bodyhead.py"
MUTANTS += [  # issue 44: the body/head family on the local trainer
    Mutant("fedrep-optim-frozen-part-steps", "fedrun/algorithms/fedrep.py",
           'names=slots[slot][1], slot=slot, live=live)', 'names=slots[slot][1], slot=slot)',
           (BODYHEAD, "-k", "fedrep and False and Vmap"),
           "FedRep's tau path with optim.*: the frozen part's optimizer steps too (weight decay, momentum)"),
    Mutant("fedrep-one-optimizer", "fedrun/algorithms/fedrep.py",
           'slot = "opt.head" if head else "opt"', 'slot = "opt"',
           (BODYHEAD, "-k", "fedrep and True and Vmap"), "FedRep's head steps take the body's optimizer slot"),
    Mutant("fedbabu-head-in-optimizer", "fedrun/algorithms/fedbabu.py",
           "{k: v for k, v in g.items() if k not in head}", "g",
           (BODYHEAD, "-k", "fedbabu"), "FedBABU: the frozen head stepped with the body"),
    Mutant("fedrod-statistics-dropped", "fedrun/algorithms/fedrod.py",
           '{k: out.params[k] for k in local.params}', '{k: local.params[k] for k in local.params}',
           (BODYHEAD, "-k", "fedrod and Vmap"), "FedRoD: the step's BatchNorm statistics not kept"),
    Mutant("partsharing-personal-statistics-shared", "fedrun/algorithms/bodyhead.py",
           "split_buffers(p)[1].items() if k not in mine}",
           "split_buffers(p)[1].items()}",
           (BODYHEAD, "-k", "personal_statistics and lgfedavg"),
           "LG-FedAvg bn=local: the personal body's statistics put on the server's model"),
    Mutant("local-statistics-shared", "fedrun/algorithms/local.py",
           "nothing to keep\n        return {}", "nothing to keep\n        return super().shared_buffers(local)",
           (BODYHEAD, "-k", "personal_statistics and local"),
           "Local bn=local: a client's statistics put on the server's (initial) model"),
]
MUTANTS += [  # GPFL's and FedPAC's BatchNorm statistics (issue 44 item 3)
    Mutant("gpfl-bn-step-statistics-dropped", "fedrun/algorithms/gpfl.py",
           '        state = untagged(out.q, "m.")\n',
           '        state = dict(local.params)\n',
           ("tests/algorithms/test_trainer_bn4b.py", "-k", "gpfl_steps"),
           "GPFL: the step's training-mode forward does not move the body's running statistics"),
    Mutant("fedpac-bn-step-statistics-dropped", "fedrun/algorithms/fedpac.py",
           '        p = stats.params\n        if self.optim.plain:',
           '        p = local.params\n        if self.optim.plain:',
           ("tests/algorithms/test_trainer_bn4b.py", "-k", "fedpac_steps"),
           "FedPAC: the step's training-mode forward does not move the model's running statistics"),
]

SAMPLING = "tests/test_sampling.py"
MUTANTS += [  # epochs draws sort only the rows a client reads (issue 44 item 4)
    Mutant("shuffled-used-partial-pass-unsorted", "fedrun/data/federated.py",
           "torch.minimum(passes, -(-used.cpu().clamp(min=0) // n))",
           "torch.minimum(passes, used.cpu().clamp(min=0) // n)",
           (SAMPLING, "-k", "used_rows"),
           "shuffled_indices(used=): the permutation a block reads only part of not sorted (rows in storage order)"),
    Mutant("shuffled-keys-gen-not-advanced", "fedrun/data/federated.py",
           "keys = torch.rand(int(seg_n.sum()), generator=gen)",
           "keys = torch.rand(int(seg_n.sum()), generator=torch.Generator().set_state(gen.get_state()))",
           (SAMPLING, "-k", "used_rows"),
           "shuffled_indices: its keys drawn from a copy of the generator (the round's later draws shifted)"),
    Mutant("shuffled-unsorted-rows-not-own", "fedrun/data/federated.py",
           "out = (off.view(-1, 1, 1) + torch.arange(length)", "out = (0 * off.view(-1, 1, 1) + torch.arange(length)",
           (SAMPLING, "-k", "used_rows"),
           "shuffled_indices(used=): the positions not sorted hold the first client's rows, not their client's"),
    Mutant("draw-passes-disjoint-used-short", "fedrun/simulate.py",
           "g, per_pass[cs] * k * B).view(m, S, k, B)", "g, (per_pass[cs] - 1) * k * B).view(m, S, k, B)",
           (SAMPLING, "-k", "sorts_only and True"),
           "epochs phase of disjoint batches (Per-FedAvg's): a pass's last step's rows not counted as read"),
    Mutant("draw-passes-shuffles-used-short", "fedrun/simulate.py",
           "g, per_pass[cs] * B).view(\n", "g, (per_pass[cs] - 1) * B).view(\n",
           (SAMPLING, "-k", "sorts_only and 2-False"),
           "epochs phase of k shuffles a pass: each shuffle's last read minibatch not sorted"),
    Mutant("finetune-epochs-used-short", "fedrun/algorithms/personalize.py",
           "ctx.gen, steps * B)", "ctx.gen, (steps - 1) * B)",
           (SAMPLING, "-k", "fine_tuning"),
           "fine-tuning in epochs: each pass's last minibatch not sorted (rows in storage order)"),
]


def _copy(dst: str) -> None:
    for name in COPY:
        src = os.path.join(REPO, name)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(dst, name), ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif os.path.exists(src):
            shutil.copy2(src, os.path.join(dst, name))


def run(m: Mutant, tests: tuple[str, ...] | None, timeout: int) -> tuple[str, str, float]:
    """(status, first failing test or note, seconds). status: caught | SURVIVED | stale | timeout."""
    with tempfile.TemporaryDirectory(prefix=f"fedrun-mutant-{m.name}-") as tmp:
        _copy(tmp)
        path = os.path.join(tmp, m.path)
        with open(path) as f:
            src = f.read()
        if src.count(m.old) != 1:
            return "stale", f"line found {src.count(m.old)} times in {m.path}", 0.0
        with open(path, "w") as f:
            f.write(src.replace(m.old, m.new))
        env = {**os.environ, "PYTHONPATH": tmp + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider", *(tests or m.tests)]
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "timeout", f"no verdict in {timeout} s", time.perf_counter() - t0
        dt = time.perf_counter() - t0
        fail = next((line.split(" - ")[0].removeprefix("FAILED ").removeprefix("ERROR ")
                     for line in p.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))), "")
        return ("caught" if p.returncode != 0 else "SURVIVED"), fail or p.stdout.strip().splitlines()[-1:][0], dt


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM as Ctrl-C: the temporary copy is removed on the way out


def main(argv=None) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help="comma-separated mutant names (default: all)")
    ap.add_argument("--tests", nargs="*", default=None,
                    help="tests to run for every mutant (default: each mutant's own)")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per mutant")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = ap.parse_args(argv)
    known = {m.name: m for m in MUTANTS}
    chosen = MUTANTS
    if args.only:
        bad = [n for n in args.only.split(",") if n not in known]
        if bad:
            print(f"--only {','.join(bad)}: not a mutant; choose from: {', '.join(known)}", file=sys.stderr)
            return 2
        chosen = [known[n] for n in args.only.split(",")]
    if args.list:
        for m in chosen:
            print(f"{m.name:<36}{m.path:<34}{m.what}")
        return 0
    print("| mutant | what | status | caught by | s |\n|---|---|---|---|---|", flush=True)
    survived = 0
    for m in chosen:
        status, by, dt = run(m, tuple(args.tests) if args.tests else None, args.timeout)
        survived += status != "caught"
        print(f"| {m.name} | {m.what} | {status} | {by} | {dt:.0f} |", flush=True)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())

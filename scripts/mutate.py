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
EPOCH_TRACES = "tests/test_golden_pfllib.py::test_local_work_in_epochs_replays_pfllib"
FEAT_TRACES = "tests/test_golden_pfllib_feat.py"
PARTS, PAPER, SHARED = "fedrun/data/partitioners/generic.py", "fedrun/data/partitioners/paper.py", "fedrun/data/partitioners/base.py"
PTESTS = "tests/data/test_partitioners.py"
MUTANTS = [
    # the survivors
    Mutant("vmap-vag-mean", "fedrun/engine/vmap.py",
           "grads = torch.autograd.grad(values.sum(), list(p.values()), allow_unused=True, materialize_grads=True)",
           "grads = torch.autograd.grad(values.mean(), list(p.values()), allow_unused=True, materialize_grads=True)",
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
           ("tests/algorithms/test_personalize_by_value.py",), "honest test-time step (FedAvg + update, Per-FedAvg): lr 2 alpha"),
    Mutant("pfedme-pm-extra-round", "fedrun/algorithms/pfedme.py",
           "        for r in range(ctx.tau):\n            local = self.client_step(",
           "        for r in range(ctx.tau + 1):\n            local = self.client_step(",
           ("tests/algorithms/test_personalize_by_value.py",), "pFedMe's honest PM: one extra local round (IndexError expected: "
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
           "g2 = {k: g2[k] - self.alpha * hv[k] for k in params}", "g2 = {k: g2[k] + self.alpha * hv[k] for k in params}",
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
           "g2 = {k: g2[k] - self.alpha * (gp[k] - gm[k]) / (2 * self.delta) for k in params}",
           "g2 = {k: g2[k] + self.alpha * (gp[k] - gm[k]) / (2 * self.delta) for k in params}",
           ("tests/algorithms/test_perfedavg.py", "-k", "quadratic or delta"), "Per-FedAvg hf: finite-difference HVP sign flipped"),
    Mutant("group-drops-a-chunk", "fedrun/engine/vmap.py",
           "            sl = slice(s, s + group)\n", "            sl = slice(s, s + group - 1)\n",
           (AGREE, "-k", "mlp and pfedme and chunks"), "full passes: each group of chunks loses its last chunk"),
    Mutant("vmap-conv-per-client-forward", "fedrun/models/small.py",
           "            h = torch.func.vmap(lambda p, xi: torch.func.functional_call(self.conv, p, (xi,)))(conv, x)",
           "            h = torch.func.vmap(lambda p, xi: torch.func.functional_call(self.conv, p, (xi,)))(conv, x.flip(0))",
           (AGREE, "-k", "cnn and fedavg and vmap"), "CNN.stacked_forward's vmapped (GPU) convolutions: clients' images swapped"),
    Mutant("per-client-sync", "fedrun/simulate.py",
           "    return torch.nonzero(~ok).flatten().tolist() if not bool(ok.all()) else []",
           "    return [i for i in range(len(ok)) if not bool(ok[i])]",
           ("tests/test_host_syncs.py", "-k", "grow"), "the divergence guard reads every client's flag from the device"),
    Mutant("cpu-index-in-round", "fedrun/simulate.py",
           "    xb, yb = data.train.rows(idx)\n", "    xb, yb = data.train.rows(idx.cpu())\n",
           ("tests/test_host_syncs.py", "-k", "fake"), "a CPU index tensor mixed into the device's minibatch gather"),
    # paper 004's debiased family against the authors' traces (tests/test_golden_pfl.py, 3 rounds)
    Mutant("feddyn-state-sign", "fedrun/algorithms/pfldyn.py",
           'g_new = {k: local["g"][k][selected] - self.alpha * delta[k] for k in w}',
           'g_new = {k: local["g"][k][selected] + self.alpha * delta[k] for k in w}',
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
    # every partitioner (issue 38 item 15): what defines it, one mutant each at least
    Mutant("iid-in-order", PARTS, "owner[rng.permutation(len(labels))] = np.arange(len(labels))",
           "owner[np.arange(len(labels))] = np.arange(len(labels))", (PTESTS,),
           "partition=iid deals rows in dataset order (contiguous blocks), not shuffled"),
    Mutant("dirichlet-alpha-ignored", PARTS, "_dirichlet_rows(len(counts), num_clients, alpha, rng)",
           "_dirichlet_rows(len(counts), num_clients, 1.0, rng)", (PTESTS,), "partition=dirichlet draws with alpha 1"),
    Mutant("dirichlet-min-size-ignored", PARTS, "if sizes.min() >= min_size:", "if True:", (PTESTS,),
           "partition=dirichlet keeps the first draw whatever min_size says"),
    Mutant("shards-in-order", PARTS, "client_of_shard = rng.permutation(total) // s",
           "client_of_shard = np.arange(total) // s", (PTESTS,), "partition=shards gives each client consecutive shards"),
    Mutant("classes-unseeded", PARTS, "perm = rng.permutation(len(present))", "perm = np.arange(len(present))",
           (PTESTS,), "partition=classes: client c owns classes c*k.. whatever the seed"),
    Mutant("quantity-in-order", PARTS, "return _groups(owner, num_clients, rng.permutation(n))",
           "return _groups(owner, num_clients, np.arange(n))", (PTESTS,),
           "partition=quantity deals rows in dataset order (each client a contiguous, label-skewed block)"),
    Mutant("quantity-sizes-unseeded", PARTS, "w = np.exp(rng.normal(0.0, _positive(\"sigma\", sigma), num_clients))",
           "w = np.exp(np.random.default_rng(0).normal(0.0, _positive(\"sigma\", sigma), num_clients))", (PTESTS,),
           "partition=quantity sizes=lognormal: the sizes drawn with seed 0 whatever the seed"),
    Mutant("mixture-drops-small-iid-share", PARTS, "owner = rng.permutation(num_clients)[:k]", "owner = np.full(k, -1)",
           (PTESTS,), "partition=mixture: an iid share smaller than the clients goes to nobody (the red team's 70 rows)"),
    Mutant("mixture-iid-frac-ignored", PARTS, "k = int(round(iid_frac * n))", "k = int(round(0.5 * n))", (PTESTS,),
           "partition=mixture deals half the rows iid whatever iid_frac says"),
    Mutant("perfedavg-split-unseeded", PAPER, "return perfedavg_mnist(labels, self.num_clients, self.a, _rs(rng))",
           "return perfedavg_mnist(labels, self.num_clients, self.a, np.random.RandomState(0))", (PTESTS,),
           "partition=perfedavg_split drawn with seed 0 whatever the seed"),
    Mutant("pfedme-labels-unseeded", PAPER, "return pfedme_mnist(labels, self.num_clients, self.labels_per_client, _rs(rng))",
           "return pfedme_mnist(labels, self.num_clients, self.labels_per_client, np.random.RandomState(0))", (PTESTS,),
           "partition=pfedme_labels drawn with seed 0 whatever the seed"),
    Mutant("acid-unseeded", PAPER, "        rs = _rs(rng)\n", "        rs = np.random.RandomState(0)\n", (PTESTS,),
           "partition=acid drawn with seed 0 whatever the seed"),
    Mutant("natural-rows-to-wrong-writers", PARTS, "return _groups(owner.astype(np.int64), len(ids), np.arange(len(labels)))",
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
           "        return self.lr_decay != 1", "        return False",
           ("tests/test_acceleration.py", "-k", "round"), "FedDyn/SCAFFOLD/PFL's decaying lr not declared round-dependent"),
    Mutant("compiled-step-round-fixed", "fedrun/run/acceleration.py",
           'rnd = rnd if getattr(algo, "step_uses_round", False) else 0', "rnd = 0",
           ("tests/test_acceleration.py", "-k", "compiled_local_steps"), "compile=default gives every step round 0"),
    # the run wing (issue 47 item 1): a job's algorithm and model built once, by its spec
    Mutant("spec-model-built-twice", "fedrun/run/spec.py",
           '        model, rng = model_built["model"], torch.get_rng_state()',
           '        model_problems(cfg, algo, model_built, in_features=data.in_features, num_classes=data.num_classes)\n'
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
           "    for e in range(epochs):", "    for e in range(epochs - 1):",
           (EPOCH_TRACES, "-k", "fedbabu"), "fine-tuning in epochs (FedBABU's): one pass short"),
    Mutant("phases-mask-off", "fedrun/simulate.py",
           "    if live is None:\n        return new", "    if True:\n        return new",
           (EPOCH_TRACES,), "rounds of phases: every client takes the largest client's steps (no mask)"),
    Mutant("epochs-partial-batch-kept", "fedrun/simulate.py",
           "per_pass = split.sizes.cpu()[: data.num_train_clients] // B",
           "per_pass = -(-split.sizes.cpu()[: data.num_train_clients] // B)",
           ("tests/test_phases.py",), "epochs phases: a pass keeps its partial last minibatch (no drop_last)"),
    # the representation methods of issue 36 (tests/test_golden_pfllib_feat.py)
    Mutant("moon-contrast-swapped", "fedrun/algorithms/moon.py",
           "out = out + mu * (torch.logsumexp(sims, 0) - sims[0]).mean()",
           "out = out + mu * (torch.logsumexp(sims, 0) - sims[1]).mean()",
           (FEAT_TRACES, "-k", "moon"), "MOON: the previous model as the positive, the server model as the negative"),
    Mutant("fedrod-balanced-dropped", "fedrun/algorithms/fedrod.py",
           "balanced = engine.criterion(logits + counts.log(), y)", "balanced = engine.criterion(logits, y)",
           (FEAT_TRACES, "-k", "fedrod"), "FedRoD: plain cross-entropy instead of the balanced softmax"),
    Mutant("fedrod-personal-alone", "fedrun/algorithms/fedrod.py",
           "return balanced + engine.criterion(logits.detach() + mine, y)", "return balanced + engine.criterion(mine, y)",
           (FEAT_TRACES, "-k", "fedrod"), "FedRoD: the personal head trained on its own logits, not added to the generic ones"),
    Mutant("fedproto-distance-summed", "fedrun/algorithms/fedproto.py",
           "out = out + lam * ((target - z) ** 2).mean()", "out = out + lam * ((target - z) ** 2).sum(-1).mean()",
           (FEAT_TRACES, "-k", "fedproto"), "FedProto: the squared distance summed over the representation, not averaged"),
    Mutant("fedproto-always-weighted", "fedrun/algorithms/fedproto.py",
           "w = counts if self.follow == \"paper\" else has.to(counts.dtype)", "w = counts",
           (FEAT_TRACES, "-k", "fedproto"), "FedProto: the global prototypes weighted by rows under follow=pfllib too"),
    Mutant("fedproto-protos-after-step", "fedrun/algorithms/fedproto.py",
           "z = client_features(engine, local[\"params\"], x)",
           "z = client_features(engine, sgd(local[\"params\"], engine.grad(local[\"params\"], x, y)[0], self.lr), x)",
           (FEAT_TRACES, "-k", "fedproto"), "FedProto: local prototypes from the model after the step (a plain CE step)"),
    Mutant("feddbe-momentum-swapped", "fedrun/algorithms/feddbe.py",
           "r = (1 - mom) * running + mom * z.mean(0)", "r = mom * running + (1 - mom) * z.mean(0)",
           (FEAT_TRACES, "-k", "feddbe"), "FedDBE: the running mean's momentum on the wrong term (in the loss)"),
    Mutant("feddbe-global-mean-unweighted", "fedrun/algorithms/feddbe.py",
           "g = (n.unsqueeze(-1) * local[\"running\"]).sum(0) / n.sum()", "g = local[\"running\"].mean(0)",
           (FEAT_TRACES, "-k", "feddbe"), "FedDBE: the global mean unweighted by the clients' rows"),
    Mutant("feddbe-bias-frozen", "fedrun/algorithms/feddbe.py",
           "\"bias\": local[\"bias\"] - self.lr * g[BIAS]", "\"bias\": local[\"bias\"]",
           (FEAT_TRACES, "-k", "feddbe"), "FedDBE: the representation bias never trained"),
    Mutant("prepare-skipped", "fedrun/simulate.py",
           "Progress(algo.prepare(engine, algo.init(r.params, data.num_clients),",
           "Progress((lambda engine, state, ctx: state)(engine, algo.init(r.params, data.num_clients),",
           (FEAT_TRACES, "-k", "fedrod or feddbe"), "the round loop never calls Algorithm.prepare (FedRoD's counts, FedDBE's global mean)"),
]

# issue 36, model-mixing methods: each one's key line against its PFLlib trace
MIX_TRACES = "tests/test_golden_pfllib_mix.py::test_official_protocol_replays_pfllib_mixing"
MUTANTS += [
    Mutant("fedamp-attention-unscaled", "fedrun/algorithms/fedamp.py",
           "self.alpha_k * torch.exp(-d / self.sigma) / self.sigma", "self.alpha_k * torch.exp(-d / self.sigma)",
           (MIX_TRACES, "-k", "fedamp"), "FedAMP: the attention weight exp(-d / sigma) without its 1 / sigma"),
    Mutant("fedphp-mmd-dropped", "fedrun/algorithms/fedphp.py",
           "(1 - self.lam) * ce + self.lam * mmd_rbf(", "(1 - self.lam) * ce + 0 * mmd_rbf(",
           (MIX_TRACES, "-k", "fedphp"), "FedPHP: the MMD toward the inherited model dropped from the loss"),
    Mutant("fedphp-inherit-swapped", "fedrun/algorithms/fedphp.py",
           "w[k] * per_client(1 - mu, w[k]) + v[k] * per_client(mu, w[k])",
           "w[k] * per_client(mu, w[k]) + v[k] * per_client(1 - mu, w[k])",
           (MIX_TRACES, "-k", "fedphp"), "FedPHP: v_i <- mu_t w_i + (1 - mu_t) v_i (the weights swapped)"),
    Mutant("fedala-weight-step-sign", "fedrun/algorithms/fedala.py",
           "local[\"weights\"][k] - self.eta * (g[k] * (G[k] - L[k]))", "local[\"weights\"][k] + self.eta * (g[k] * (G[k] - L[k]))",
           (MIX_TRACES, "-k", "fedala"), "FedALA: the ALA weights climb the loss (the step's sign flipped)"),
    # issue 36's methods with modules beside the model (tests/test_golden_pfllib_module.py)
    Mutant("fedpac-alignment-sum", "fedrun/algorithms/fedpac.py",
           "return ce + lam * ((target - feats) ** 2).mean()", "return ce + lam * ((target - feats) ** 2).sum()",
           ("tests/test_golden_pfllib_module.py", "-k", "fedpac_replays"),
           "FedPAC's alignment term summed over the features instead of averaged"),
    Mutant("fedpac-qp-no-bias", "fedrun/algorithms/fedpac.py",
           "+ E @ E.transpose(1, 2)).double()", "+ 0 * E @ E.transpose(1, 2)).double()",
           ("tests/test_golden_pfllib_module.py", "-k", "fedpac_replays"), "FedPAC's head QP without its bias term D_i"),
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
           "upload = {k: 0.5 * mine[k] + 0.5 * local[\"head_g\"][k] for k in mine}", "upload = {k: mine[k] for k in mine}",
           ("tests/test_golden_pfllib_fedcp.py", "-k", "replays"), "FedCP uploads its personalized head as the global one (no mixing)"),
]

# issue 36, APPLE: its key lines against its PFLlib trace
APPLE_TRACE = "tests/test_golden_pfllib_apple.py"
MUTANTS += [
    Mutant("apple-proximal-dropped", "fedrun/algorithms/apple.py",
           "grad = dots + (local[\"lam\"] * self.mu).unsqueeze(1) * (p - local[\"p0\"])", "grad = dots",
           (APPLE_TRACE,), "APPLE: the proximal pull of p_i toward p0 dropped from p's gradient"),
    Mutant("apple-own-core-frozen", "fedrun/algorithms/apple.py",
           "dots = torch.where(own.bool(), mine.unsqueeze(1), dots)", "dots = dots",
           (APPLE_TRACE,), "APPLE: p_ii's gradient with the client's core as downloaded, not as it trains"),
    Mutant("apple-core-lr-unscaled", "fedrun/algorithms/apple.py",
           "pii = (p * own).sum(1) * local[\"scale\"]", "pii = (p * own).sum(1)",
           (APPLE_TRACE,), "APPLE: the own core's step without PFLlib's lr x C"),
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
    ap.add_argument("--tests", nargs="*", default=None, help="tests to run for every mutant (default: each mutant's own)")
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
    print(f"| mutant | what | status | caught by | s |\n|---|---|---|---|---|", flush=True)
    survived = 0
    for m in chosen:
        status, by, dt = run(m, tuple(args.tests) if args.tests else None, args.timeout)
        survived += status != "caught"
        print(f"| {m.name} | {m.what} | {status} | {by} | {dt:.0f} |", flush=True)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())


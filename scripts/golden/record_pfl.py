"""Golden traces of the authors' paper-004 code (github.com/alpemreacar/PFL, the snapshot in
/work/.mirror/alpemreacar+PFL) on a tiny fixed problem, for tests/test_golden_pfl.py.

    mkdir -p /tmp/pfl_authors && git -C /work/.mirror/alpemreacar+PFL/repo archive HEAD | tar -x -C /tmp/pfl_authors
    python -m venv --system-site-packages /tmp/authvenv && /tmp/authvenv/bin/pip install higher==0.2.1
    /tmp/authvenv/bin/python scripts/golden/record_pfl.py --authors /tmp/pfl_authors \
        --commit $(git -C /work/.mirror/alpemreacar+PFL/repo rev-parse HEAD) [--out tests/fixtures/golden]

(higher 0.2.1 is the authors' code's own dependency.) The committed traces: their commit 0ba7929,
torch 2.14.1, 4 minutes on one core; re-recording gives byte-identical files.

It imports the authors' modules (utils_methods, utils_general, utils_dataset, utils_models) from
--authors and calls their train_* functions, unchanged, on the problem of `pfl_problem.py` (3
devices, CIFAR-shaped random images, their CIFAR CNN with fixed initial weights): 3 rounds, 2 of
the 3 devices per round (their own seeded selection, act_prob=2/3), K=2 local steps of batch 4,
lr 0.1 decayed x0.8 per round (0.997 in the paper; stronger here so that round-dependent
scalings show), weight decay 1e-3, their gradient-norm clip 10 (it acts on some training steps
and on most test-time fine-tuning steps of this problem), the paper's alpha / meta lr /
adaptation steps per method except 2 MAML adaptation steps where the paper takes 5 (the test's
run time), all in float64 (patch 0). Each method writes tests/fixtures/golden/pfl_<method>.json with,
per round: the sampled devices, every trained device model, the server model, the average of the
sampled devices' models ("sel") and of ALL devices' latest models ("all"), the per-device states
(FedDyn's lambda_i = PFLDyn's g_i; SCAFFOLD's c_i) and the server's (mean lambda = h; c), each
as pfl_problem.sketch: per tensor [sum, L2 norm] and 8 random projections (linear in every entry),
plus one entry per tensor; the gradient norms their clip saw; and their
personalized evaluation ("sel" and "all" models, on the test rows and on the training rows),
averaged and per device.

Run-time patches (precision, data, loaders, bookkeeping; the math is left alone):
  0. float64: their modules are imported from a temporary copy in which the dtype names float32 /
     .float() read float64 / .double() (and torch's default dtype is float64, so their model is
     built in float64). In float32 their own rounding dominates: from the same weights, one
     device's 3 Per-FedAvg steps (5 MAML steps each) moved their first conv layer 1.5e-5 away
     from their own float64 result (fedrun float32: 1e-7 away), and in a 3-round version of this
     problem a 1e-7 perturbation of the initial weights grew to 1e-2. In float64 their code and
     fedrun agree to ~1e-15 per step, so the traces can be checked tightly.
  1. utils_dataset.DatasetObject.mean/std = 0/1: their Normalize becomes the identity (the problem's
     images are already what the model sees).
  2. torch.utils.data.DataLoader: a loader with shuffle=True (their training loaders) yields the
     next batches of the device's fixed sequence (pfl_problem.batch_pairs) without augmentation;
     shuffle=False loaders (their evaluation) are torch's own. The recorder checks that every
     device consumed exactly K (plain) or 2K (MAML, Proto) batches per round it trained, so no
     Proto pair was rejected and fedrun can be fed the same sequence.
  3. utils_methods.get_all_results_{maml,proto,plain}: wrapped to read the training function's
     state (its local variables) after each round's server step and to evaluate every device
     separately with their get_*_acc_loss; then the original runs.
  4. torch.nn.utils.clip_grad_norm_: wrapped to record the norms it returns (it still clips).
  5. Their files go to a temporary working directory (Model/<name>/...); stdout is silenced.

Findings (fedrun before this comparison vs their code; fixed in fedrun unless said otherwise):
  * PFLDyn/FedDyn clip: their regularizer -<w, lambda_i> - alpha <w, w^t> + alpha/2 ||w||^2 is in
    the loss, so clip_grad_norm_ clips the proximal gradient too; fedrun added it after the clip.
  * PFLScaf/SCAFFOLD: c_i += -c + (w^t - w_i) / (K * learning_rate) with the UNDECAYED lr (Alg. 2's
    1/(K beta)); fedrun divided by the sum of the round's decayed lrs.
  * MAML: their inner optimizer is SGD with the run's weight decay (fedrun: none); their test-time
    fine-tuning clips every full-batch step at max_norm (fedrun: no clip; here it binds).
  * P-Avg (Proto): train_proto_model sets model.proto = False INSIDE its step loop, so only each
    round's first local step uses the Proto features, the later ones the 10 logits. Under
    protocol=official fedrun does the same (algo.proto_first_step_only); honest keeps the features.
  * P-Avg (Proto): their output layer gets no gradient from the Proto loss, so SGD does not decay
    it (a parameter without .grad is skipped); fedrun decayed it.
  * Aggregation is a plain mean over the sampled devices; fedrun's official protocol weighted by
    sample counts (the paper-004 presets now set aggregate=uniform; ACID sizes are equal anyway).
  * Evaluation: their plotted curves (cifar10_ACID.py: the 6th return value, tst_perf_all) score
    the mean of ALL devices' latest local models ("all"), never the server model; for PFLDyn the
    server (cloud) model is not even the average of the sampled devices. fedrun: option
    algo.eval_model=clients_mean, on under protocol=official; honest scores the server model,
    whose PFLScaf/P-Avg numbers are their "sel" evaluation (printed, not plotted).
  * Their per-device averages weigh every device equally (loss_clnt * len(tst_y), len = number of
    devices), i.e. fedrun's *_acc_mean / *_loss_mean.
  * Not reproduced: FedDyn's and SCAFFOLD's curves in the paper are their models after Proto
    adaptation at test time ("No Per., ... - Proto A."); fedrun's FedDyn/SCAFFOLD serve the plain
    model (matched here), the Proto- and MAML-adapted numbers are recorded but not compared.
  * The same maths from the same weights in float64 agree to ~1e-15 per step; the rest of every
    difference was float64 rounding (the test's tolerance: 1e-9 relative, 1e-10 absolute). In
    PFLDyn/PFLScaf (Proto) the two codes' rounding differences grow ~100x per round: in round 3
    the closest number (the sum of a c_i tensor, 102k entries) is at 0.35 of its tolerance.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pfl_problem as P  # noqa: E402

ROUNDS, K, LR, LR_DECAY, WEIGHT_DECAY = 3, 2, 0.1, 0.8, 1e-3
MAML_STEPS = 2  # adaptation steps where the paper takes 5 (Per-FedAvg, PFLDyn (MAML)): keeps the test fast
# patch 0: their dtype names, textually, in a temporary copy of their modules (nothing else changes)
FLOAT64 = [("'float32'", "'float64'"), ("np.float32", "np.float64"), ("torch.float32", "torch.float64"),
           (".float()", ".double()")]
ACT_PROB = 2 / 3  # int(2/3 * 3) = 2 devices per round

# method -> (authors' function, its method-specific arguments, batches per local step)
METHODS = {
    "pavg_maml": ("train_Meta_FedAvg_MAML", dict(meta_learning_rate=0.01, num_grad_step=MAML_STEPS), 2),
    "pavg_proto": ("train_Meta_FedAvg_Proto", {}, 2),
    "pfldyn_maml": ("train_Meta_FedDyn_MAML", dict(alpha=0.01, meta_learning_rate=0.01, num_grad_step=MAML_STEPS), 2),
    "pfldyn_proto": ("train_Meta_FedDyn_Proto", dict(alpha=0.1), 2),
    "pflscaf_maml": ("train_Meta_SCAFFOLD_MAML", dict(meta_learning_rate=0.1, num_grad_step=1), 2),
    "pflscaf_proto": ("train_Meta_SCAFFOLD_Proto", {}, 2),
    "feddyn": ("train_FedDyn", dict(alpha=0.01, meta_learning_rate_list=[0.1], num_grad_step_list=[1],
                                    do_proto=True, do_plain=True), 1),
    "scaffold": ("train_SCAFFOLD", dict(meta_learning_rate_list=[0.1], num_grad_step_list=[1],
                                        do_proto=True, do_plain=True), 1),
}

PAPER = {m: dict(num_grad_step=5) for m in ("pavg_maml", "pfldyn_maml")}  # settings the trace changes

# A few fixed flat positions of the parameter vector recorded verbatim (one per tensor, mid-tensor).
_SIZES = [int(np.prod(s)) for s in P.SHAPES]
_OFFSETS = np.concatenate([[0], np.cumsum(_SIZES)[:-1]])
ENTRIES = [int(o + n // 2) for o, n in zip(_OFFSETS, _SIZES)]
PROJ = P.projections()


def stats(vec) -> dict:
    """pfl_problem.sketch of a flat parameter vector: per tensor [sum, L2 norm] (fedrun names) and
    its P.PROJECTIONS random projections, and the entries at ENTRIES."""
    v = torch.as_tensor(np.asarray(vec, dtype=np.float64).reshape(-1))
    return P.sketch([v[o:o + n] for o, n in zip(_OFFSETS, _SIZES)], PROJ, ENTRIES)


class Recorder:
    def __init__(self, authors: str):
        self.tmp = tempfile.mkdtemp(prefix="pfl_golden_")
        src = os.path.join(self.tmp, "src")  # patch 0: a float64 copy of their modules
        os.makedirs(src)
        for name in ("utils_libs", "utils_models", "utils_dataset", "utils_general", "utils_methods"):
            with open(os.path.join(authors, f"{name}.py")) as f:
                text = f.read()
            for a, b in FLOAT64:
                text = text.replace(a, b)
            with open(os.path.join(src, f"{name}.py"), "w") as f:
                f.write(text)
        sys.path.insert(0, src)
        torch.set_default_dtype(torch.float64)  # their model_func() builds float64 layers
        os.chdir(self.tmp)
        with contextlib.redirect_stdout(io.StringIO()):
            import utils_dataset
            import utils_general
            import utils_methods
            import utils_models
        self.D, self.G, self.M, self.Mod = utils_dataset, utils_general, utils_methods, utils_models
        self.D.DatasetObject.mean = np.zeros(3)  # patch 1
        self.D.DatasetObject.std = np.ones(3)
        self.problem = P.data()
        self.clnt_x = [x for x, _ in self.problem["train"]]
        self.clnt_y = [y.reshape(-1, 1).astype(np.float64) for _, y in self.problem["train"]]
        self.tst_x = [x for x, _ in self.problem["test"]]
        self.tst_y = [y.reshape(-1, 1).astype(np.float64) for _, y in self.problem["test"]]
        self.real_loader = torch.utils.data.DataLoader
        self.real_clip = torch.nn.utils.clip_grad_norm_
        for name in ("get_all_results_maml", "get_all_results_proto", "get_all_results_plain"):
            setattr(self.M, name, self._wrap_results(name, getattr(self.M, name)))  # patch 3

    # -- patch 2: the fixed minibatch sequence
    def _loader(self):
        rec = self

        class FixedLoader:
            def __init__(self, dataset, batch_size=1, shuffle=False, **kw):
                self.dataset, self.shuffle = dataset, shuffle
                self.real = None if shuffle else rec.real_loader(dataset, batch_size=batch_size, shuffle=False, **kw)
                if shuffle:
                    n = len(dataset)
                    self.client = [c for c, x in enumerate(rec.clnt_x)
                                   if len(x) == n
                                   and torch.equal(torch.tensor(x).to(dataset.X_data.dtype), dataset.X_data)]
                    assert len(self.client) == 1, "could not identify the training device"
                    self.client = self.client[0]

            def __iter__(self):
                if not self.shuffle:
                    yield from self.real
                    return
                c = self.client
                while True:
                    idx = rec.queue[c][rec.used[c]]
                    rec.used[c] += 1
                    rec.consumed[c].append([int(i) for i in idx])
                    self.dataset.train = False  # no augmentation: items go through the (identity) Normalize
                    yield torch.utils.data.default_collate([self.dataset[int(i)] for i in idx])

        return FixedLoader

    # -- patch 4: observe the clip
    def _clip(self, parameters, max_norm, *a, **kw):
        norm = self.real_clip(parameters, max_norm, *a, **kw)
        self.norms.append(float(norm))
        return norm

    # -- patch 3: per-round state and per-device evaluation
    def _wrap_results(self, name, fn):
        rec = self

        def wrapped(*args, **kwargs):
            f = sys._getframe(1).f_locals
            i = int(f["i"])
            rnd = rec.rounds.setdefault(i, {})
            if "selected" not in rnd:
                rec._state(rnd, f, i)
            kind = name.rsplit("_", 1)[1]
            if kind == "maml":
                meta_lr, steps = args[0], args[1]
                kind = f"maml_lr{meta_lr:g}_steps{steps}"
            rec.norms.clear()
            rnd.setdefault("eval", {})[kind] = rec._evaluate(name, args, f)
            rnd.setdefault("eval_clip_max", {})[kind] = max(rec.norms, default=0.0)  # test-time clip (MAML)
            result = fn(*args, **kwargs)
            rec.norms.clear()
            return result

        return wrapped

    def _state(self, rnd, f, i):
        sel = [int(c) for c in f["selected_clnts"]]
        clnt = f["clnt_params_list"]
        rnd["round"] = i + 1
        rnd["lr"] = LR * LR_DECAY ** i
        rnd["selected"] = sorted(sel)
        rnd["clients"] = {str(c): stats(clnt[c]) for c in sorted(sel)}
        rnd["avg_sel"] = stats(np.mean(clnt[sel], axis=0))
        rnd["avg_all"] = stats(np.mean(clnt, axis=0))
        if "cld_mdl_param" in f:  # FedDyn / PFLDyn: the cloud model sent next round, lambda_i = g_i
            rnd["server"] = stats(f["cld_mdl_param"])
            lam = f["lambda_model_list"]
            rnd["state_clients"] = {str(c): stats(lam[c]) for c in range(len(lam))}
            rnd["state_server"] = stats(np.mean(lam, axis=0))  # fedrun's h
        elif "c_state_list" in f:  # SCAFFOLD / PFLScaf: c_i and c = mean c_i
            rnd["server"] = stats(f.get("server_params", f.get("server_model_param")))
            cs = f["c_state_list"]
            rnd["state_clients"] = {str(c): stats(cs[c]) for c in range(len(cs))}
            rnd["state_server"] = stats(np.mean(cs, axis=0))
        else:
            rnd["server"] = rnd["avg_sel"]
        rnd["clip_norms"] = self.norms[:]  # training steps of the round, devices in their order

    def _evaluate(self, name, args, f):
        """Their aggregate numbers (sel / all models, test / train rows) and the per-device ones."""
        G = self.G
        avg_model, all_model = f["avg_model"], f["all_model"]
        if name.endswith("maml"):
            meta_lr, steps = args[0], args[1]
            one = lambda m, c, tx, ty: G.get_maml_acc_loss(self.clnt_x[c], self.clnt_y[c], m, self._model_func,
                                                           meta_lr, steps, "CIFAR10", tst_x=tx, tst_y=ty)
        elif name.endswith("proto"):
            one = lambda m, c, tx, ty: G.get_proto_acc_loss(self.clnt_x[c], self.clnt_y[c], m, self._model_func,
                                                            "CIFAR10", tst_x=tx, tst_y=ty)
        else:
            one = lambda m, c, tx, ty: G.get_acc_loss(tx, ty, m, "CIFAR10")
        out = {}
        for label, model in (("sel", avg_model), ("all", all_model)):
            for where, xs, ys in (("test", self.tst_x, self.tst_y), ("train", self.clnt_x, self.clnt_y)):
                per = [one(model, c, xs[c], ys[c]) for c in range(P.NUM_CLIENTS)]
                out[f"{label}_{where}"] = {"loss": [float(l) for l, _ in per], "acc": [float(a) for _, a in per]}
        return out

    def run(self, method: str) -> dict:
        fn_name, extra, batches = METHODS[method]
        self.queue = [[np.asarray(b) for b in seq] for seq in P.batch_pairs(ROUNDS * K)]
        self.used = [0] * P.NUM_CLIENTS
        self.consumed = [[] for _ in range(P.NUM_CLIENTS)]
        self.rounds, self.norms = {}, []
        self._model_func = lambda: self.Mod.client_model("cifar10")
        init = self._model_func()
        p0 = P.initial_params()
        init.load_state_dict({theirs: p0[ours] for ours, theirs in P.NAMES})
        data_obj = type("GoldenData", (), dict(
            dataset="CIFAR10", name=f"golden_{method}", n_client=P.NUM_CLIENTS, clnt_x=self.clnt_x,
            clnt_y=self.clnt_y, tst_x=self.tst_x, tst_y=self.tst_y))()
        os.makedirs(f"Model/{data_obj.name}", exist_ok=True)
        torch.utils.data.DataLoader = self._loader()  # patch 2
        torch.nn.utils.clip_grad_norm_ = self._clip  # patch 4
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                getattr(self.M, fn_name)(
                    data_obj=data_obj, act_prob=ACT_PROB, learning_rate=LR, batch_size=P.BATCH, K=K,
                    com_amount=ROUNDS, print_per=0, weight_decay=WEIGHT_DECAY, model_func=self._model_func,
                    init_model=init, save_period=ROUNDS, lr_decay=LR_DECAY, save_models=False,
                    fast_exec=False, **extra)
        finally:
            torch.utils.data.DataLoader = self.real_loader
            torch.nn.utils.clip_grad_norm_ = self.real_clip
        rounds = [self.rounds[i] for i in sorted(self.rounds)]
        # Split each device's consumed batches into its rounds; every training round takes exactly
        # K * batches (no Proto rejection), else fedrun could not be fed the same sequence.
        per_round = K * batches
        taken = [0] * P.NUM_CLIENTS
        for rnd in rounds:
            rnd["batches"] = {}
            for c in rnd["selected"]:
                rnd["batches"][str(c)] = self.consumed[c][taken[c]:taken[c] + per_round]
                taken[c] += per_round
        assert taken == [len(b) for b in self.consumed], f"{method}: batches consumed {self.consumed} vs rounds"
        return {
            "method": method, "authors_function": fn_name, "arguments": {k: v for k, v in extra.items()},
            "rounds_total": ROUNDS, "K": K, "lr": LR, "lr_decay": LR_DECAY, "weight_decay": WEIGHT_DECAY,
            "act_prob": ACT_PROB, "clip": float(self.G.max_norm), "dtype": "float64", "batch_size": P.BATCH,
            "paper_arguments": PAPER.get(method, {}),
            "batches_per_step": batches, "entries": ENTRIES, "problem": P.checksums(), "rounds": rounds,
            "torch": torch.__version__,
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--authors", required=True, help="work tree of alpemreacar/PFL (utils_methods.py ...)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "golden"))
    ap.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--commit", default=None, help="the authors' commit the work tree is from (recorded)")
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    torch.set_num_threads(1)
    rec = Recorder(a.authors)
    for m in a.methods:
        trace = {"authors_commit": a.commit, **rec.run(m)}
        path = os.path.join(out, f"pfl_{m}.json")
        with open(path, "w") as f:
            json.dump(trace, f, indent=0)
        print(f"{m}: {os.path.getsize(path) // 1024} KB -> {path}", file=sys.stderr)


if __name__ == "__main__":
    main()

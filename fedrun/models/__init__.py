"""Plain nn.Modules. The engine uses them functionally (torch.func.functional_call) with stacked
per-client parameters; the modules themselves hold only the initial weights.

Every model's `forward(x, features=True)` returns its last hidden layer (the Proto features of paper
004), so `functional_call(model, params, (x,), {"features": True})` gives them. fedrun's models
also take `features="both"`: (features, logits) from one pass (`features_and_logits = True`), which
Proto's test-time prototypes use to get the training loss without a second pass; other models
need not.

Fully connected models also offer `stacked_forward(params, x)`: logits [m, B, classes] for stacked
params [m, ...] and inputs [m, B, ...] as batched matrix products. It must compute what vmap over
`functional_call` computes (no train/eval-mode behaviour: fedrun's models have none), with less
per-call overhead: the engine's minibatch losses and, for fully connected models, its full passes
with per-client params (the personalized models' evaluation) go through it. They also offer
`class_major_logits(params, x)`: one model's logits as [classes, n] (the engine's full passes with
one model for all clients).
"""
from .small import CNN, CNNBN, MLP, MLPBN, MLR

__all__ = ["CNN", "CNNBN", "MLP", "MLPBN", "MLR"]

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
one model for all clients). These fast paths are optional: a model without them goes through
vmap(functional_call) everywhere, which is all the engine requires.

What the engine does require of a model: `num_classes`; forward(x) -> logits [B, num_classes] and
`features` as above; no behaviour that differs between training and evaluation but BatchNorm's (the
engine switches BatchNorm models to training mode for their steps and keeps their running statistics
per client); no buffers but BatchNorm's (any other would be taken for a trainable parameter); and
its output layer as `head` (MLR's and MLP's a property), owning the model's last parameters: FedPer,
FedRep, LG-FedAvg and FedBABU split the model there (fedrun.engine.tree.head_names).

Modules: small (the 2020-21 papers' models and PFLlib's FedAvgCNN), resnet (ResNet-10/18/34 with a
CIFAR stem), rnn (LEAF's Shakespeare LSTM), text (fastText, TextCNN, a small Transformer).
"""
from .resnet import ResNet, ResNet10, ResNet18, ResNet34
from .rnn import LSTM
from .small import CNN, CNNBN, MLP, MLPBN, MLR, FedAvgCNN
from .text import FastText, TextCNN, Transformer

__all__ = ["CNN", "CNNBN", "MLP", "MLPBN", "MLR", "FedAvgCNN", "ResNet", "ResNet10", "ResNet18", "ResNet34", "LSTM",
           "FastText", "TextCNN", "Transformer"]

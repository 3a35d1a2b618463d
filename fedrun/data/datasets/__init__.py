"""Data sources, one module per source: `idx` (MNIST, Fashion-MNIST, EMNIST), `cifar` (CIFAR-10/100),
`leaf` (LEAF's JSON: FEMNIST), `synthetic` (FedProx's generator). Each is a class that
`conf/dataset/<name>.yaml` instantiates by `_target_`; `base` holds the contract."""

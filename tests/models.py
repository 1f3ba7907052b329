"""Random DAG models built from a seed, for exactness tests of the executor."""

from __future__ import annotations

import random

import torch
from torch import nn


class RandomDAGNet(nn.Module):
    """A network whose forward pass is a random DAG of conv/BN/ReLU/dropout/add/cat/pool nodes.

    Every node reads 1–2 earlier nodes (so long skips and joins appear), the same ``seed`` always
    gives the same architecture, and all nodes end in one output head.
    """

    def __init__(self, seed: int, nodes: int = 12, channels: int = 4):
        super().__init__()
        rng = random.Random(seed)
        self.c = channels
        self.spec: list[tuple[str, list[int]]] = []
        self.layers = nn.ModuleDict()
        for i in range(nodes):
            kind = rng.choice(["conv", "conv", "bn", "relu", "dropout", "add", "cat", "pool", "tanh"])
            src = [rng.randrange(i + 1)]  # node 0 is the input
            if kind in ("add", "cat") and i > 0:
                src.append(rng.randrange(i + 1))
            if kind == "conv":
                self.layers[str(i)] = nn.Conv2d(channels, channels, 3, padding=1)
            elif kind == "bn":
                self.layers[str(i)] = nn.BatchNorm2d(channels)
            elif kind == "cat":
                self.layers[str(i)] = nn.Conv2d(2 * channels, channels, 1)
            elif kind == "dropout":
                self.layers[str(i)] = nn.Dropout(0.3)
            self.spec.append((kind, src))
        self.head = nn.Conv2d(channels, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values = [x]
        for i, (kind, src) in enumerate(self.spec):
            a = values[src[0]]
            if kind in ("conv", "bn", "dropout"):
                y = self.layers[str(i)](a)
            elif kind == "relu":
                y = torch.relu(a)
            elif kind == "tanh":
                y = torch.tanh(a)
            elif kind == "pool":
                y = nn.functional.max_pool2d(a, 3, stride=1, padding=1)
            elif kind == "add":
                y = a + values[src[-1]]
            else:
                y = self.layers[str(i)](torch.cat([a, values[src[-1]]], dim=1))
            values.append(y)
        # every value reaches the output, so no node is dead
        return self.head(sum(values[1:]))


class Tricky(nn.Module):
    """In-place ops, views, a multi-output op and BatchNorm's counter: none may add a node."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(2 * 4 * 4, 3)

    def forward(self, x):
        y = self.bn(self.conv(x)).relu_()  # conv, bn, relu (in place)
        a, b = y.chunk(2, dim=1)  # views of relu's output: no node
        z = a * b  # mul
        z += x[:, :2]  # add (in place) reading a view of the input
        return self.fc(z.flatten(1))  # linear; flatten is a view


class LiteralConstant(nn.Module):
    """A forward that makes a tensor from a literal: export lifts it into a constant of the joint
    module (a ``get_attr`` node), as in torchvision's Swin."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 2), nn.Linear(2, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)) * torch.tensor([2.0, 3.0]))


class TimeTable:
    """A time model whose every op key costs what the table says (1 ms for what it does not list)."""

    def __init__(self, seconds: dict[str, float]):
        self.seconds, self.asked = seconds, []

    def costs(self, calls):
        self.asked += calls
        return [self.seconds.get(str(c.target), 1e-3) for c in calls]

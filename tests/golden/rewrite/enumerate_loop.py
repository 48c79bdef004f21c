# args: --stages 2
import torch
from torch import nn


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)])
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x) * (i + 1)
        return self.out(x)
# output:
# args: --stages 2
import torch
from torch import nn
from torch.distributed.pipelining import pipe_split


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)])
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        for i, layer in enumerate(self.layers[:2]):
            x = layer(x) * (i + 1)
        pipe_split()  # syncpass sync 1/1: 64 KiB, 346 us/step predicted
        for i, layer in enumerate(self.layers[2:], start=2):
            x = layer(x) * (i + 1)
        return self.out(x)

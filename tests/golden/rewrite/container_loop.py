# args: --stages 3 --model Tower
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + self.fc(x)


class Tower(nn.Module):
    """Blocks in a ModuleList, looped over in forward."""

    def __init__(self, depth: int = 6, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Linear(4, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        h = self.embed(x)
        # the residual tower
        for block in self.blocks:
            h = block(h)  # one block per iteration
        return self.norm(h)
# output:
# args: --stages 3 --model Tower
import torch.nn as nn
from torch.distributed.pipelining import pipe_split


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + self.fc(x)


class Tower(nn.Module):
    """Blocks in a ModuleList, looped over in forward."""

    def __init__(self, depth: int = 6, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Linear(4, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        h = self.embed(x)
        # the residual tower
        for block in self.blocks[:2]:
            h = block(h)  # one block per iteration
        pipe_split()  # syncpass sync 1/2: 64 KiB, 346 us/step predicted
        for block in self.blocks[2:4]:
            h = block(h)  # one block per iteration
        pipe_split()  # syncpass sync 2/2: 64 KiB, 346 us/step predicted
        for block in self.blocks[4:]:
            h = block(h)  # one block per iteration
        return self.norm(h)

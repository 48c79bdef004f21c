# args: --stages 3 --threshold inf
from torch import nn


class Partial(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Linear(8, 8) for _ in range(8)])

    def forward(self, x):
        x = self.blocks[0](x)
        x = self.blocks[1](x)
        for block in self.blocks[2:]:
            x = block(x)
        return x
# output:
# args: --stages 3 --threshold inf
from torch import nn
from torch.distributed.pipelining import pipe_split


class Partial(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Linear(8, 8) for _ in range(8)])

    def forward(self, x):
        x = self.blocks[0](x)
        x = self.blocks[1](x)
        for block in self.blocks[2:3]:
            x = block(x)
        pipe_split()  # syncpass sync 1/2: 64 KiB, 346 us/step predicted
        for block in self.blocks[3:5]:
            x = block(x)
        pipe_split()  # syncpass sync 2/2: 64 KiB, 346 us/step predicted
        for block in self.blocks[5:]:
            x = block(x)
        return x

# args: --stages 3 --depth 2 --model ConvNet
from torch import nn


def stage(width: int, blocks: int) -> nn.Sequential:
    return nn.Sequential(*[nn.Conv2d(width, width, 3, padding=1) for _ in range(blocks)])


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.layer1 = stage(8, 3)
        self.layer2 = stage(8, 3)
        self.head = nn.Linear(8, 10)

    def forward(self, images):
        x = self.stem(images)
        x = self.layer1(x)  # the first stage of blocks
        x = self.layer2(x)
        return self.head(x.mean((2, 3)))
# output:
# args: --stages 3 --depth 2 --model ConvNet
from torch import nn
from torch.distributed.pipelining import pipe_split


def stage(width: int, blocks: int) -> nn.Sequential:
    return nn.Sequential(*[nn.Conv2d(width, width, 3, padding=1) for _ in range(blocks)])


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.layer1 = stage(8, 3)
        self.layer2 = stage(8, 3)
        self.head = nn.Linear(8, 10)

    def forward(self, images):
        x = self.stem(images)
        x = self.layer1[:2](x)  # the first stage of blocks
        pipe_split()  # syncpass sync 1/2: 64 KiB, 346 us/step predicted
        x = self.layer1[2:](x)  # the first stage of blocks
        x = self.layer2[:2](x)
        pipe_split()  # syncpass sync 2/2: 64 KiB, 346 us/step predicted
        x = self.layer2[2:](x)
        return self.head(x.mean((2, 3)))

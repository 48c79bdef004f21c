# args: --stages 3
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 32)
        self.l1 = nn.Linear(32, 32)
        self.l2 = nn.Linear(32, 32)
        self.l3 = nn.Linear(32, 32)
        self.l4 = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(self.l1(x))
        x = torch.relu(self.l2(x))
        x = torch.relu(self.l3(x))
        x = torch.relu(self.l4(x))
        return self.head(x)
# output:
# args: --stages 3
import torch
from torch import nn
from torch.distributed.pipelining import pipe_split


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 32)
        self.l1 = nn.Linear(32, 32)
        self.l2 = nn.Linear(32, 32)
        self.l3 = nn.Linear(32, 32)
        self.l4 = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(self.l1(x))
        pipe_split()  # syncpass sync 1/2: 64 KiB, 346 us/step predicted
        x = torch.relu(self.l2(x))
        x = torch.relu(self.l3(x))
        pipe_split()  # syncpass sync 2/2: 64 KiB, 346 us/step predicted
        x = torch.relu(self.l4(x))
        return self.head(x)

# args: --stages 3
from torch import nn
from torch.distributed.pipelining import pipe_split


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.c = nn.Linear(4, 4)
        self.d = nn.Linear(4, 4)

    def forward(self, x):
        x = self.a(x)
        pipe_split()  # placed by hand
        x = self.b(x)
        x = self.c(x)
        return self.d(x)
# output:
# args: --stages 3
from torch import nn
from torch.distributed.pipelining import pipe_split


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.c = nn.Linear(4, 4)
        self.d = nn.Linear(4, 4)

    def forward(self, x):
        x = self.a(x)
        pipe_split()  # placed by hand
        x = self.b(x)
        pipe_split()  # syncpass sync 2/2: 64 KiB, 346 us/step predicted
        x = self.c(x)
        return self.d(x)

# args: --stages 1
from torch import nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)

    def forward(self, x):
        x = self.a(x)
        return self.b(x)
# output:
# args: --stages 1
from torch import nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)

    def forward(self, x):
        x = self.a(x)
        return self.b(x)

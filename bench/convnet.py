"""The conv net of the report behind issue 27: a residual net of four stages of two
blocks, batch 16 of 32x32 images, batch norms in eval mode (`bench/bench_predict.py
--models convnet`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        skip = x if self.down is None else self.down(x)
        return F.relu(out + skip)


class ResNet(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (16, 32, 64, 128), classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        blocks: list[nn.Module] = []
        cin = widths[0]
        for i, w in enumerate(widths):
            blocks.append(BasicBlock(cin, w, 1 if i == 0 else 2))
            blocks.append(BasicBlock(w, w, 1))
            cin = w
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        x = x.mean((2, 3))
        logits: torch.Tensor = self.head(x)
        return logits


def example() -> tuple[nn.Module, tuple[torch.Tensor], torch.Tensor, object]:
    torch.manual_seed(0)
    model = ResNet().eval()
    return model, (torch.randn(16, 3, 32, 32),), torch.randint(0, 10, (16,)), F.cross_entropy

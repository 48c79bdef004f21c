"""A small residual convolutional network for 32x32 images, for ``syncpass run``.

A stem, four stages of residual blocks (each stage an ``nn.Sequential``) that
halve the resolution and double the width, global average pooling and a
classifier. The stages cost very different amounts: the early ones work on
large feature maps, the late ones hold most of the parameters.

Normalisation is GroupNorm rather than BatchNorm: batch statistics would
depend on the micro-batch size, so a pipelined step would not compute the same
gradients as the whole batch, and running-statistics updates are buffer writes
that a pipeline stage does not carry.
"""

from __future__ import annotations

import torch
from torch import nn

BATCH = 8
SIZE = 32
CLASSES = 10


def norm(channels: int) -> nn.GroupNorm:
    """GroupNorm with eight channels per group."""
    return nn.GroupNorm(max(1, channels // 8), channels)


class ResidualBlock(nn.Module):
    """Two 3x3 convolutions on a residual connection (a 1x1 projection when the shape changes)."""

    def __init__(self, inputs: int, outputs: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=False)
        self.norm1 = norm(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, padding=1, bias=False)
        self.norm2 = norm(outputs)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False), norm(outputs)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = self.shortcut(x)
        x = self.conv1(x)
        x = self.norm1(x)
        x = self.relu(x)
        x = self.conv2(x)
        x = self.norm2(x)
        x = self.relu(x + residual)
        return x


def stage(inputs: int, outputs: int, blocks: int, stride: int) -> nn.Sequential:
    """``blocks`` residual blocks; the first changes the width and the resolution."""
    layers = [ResidualBlock(inputs, outputs, stride)]
    layers += [ResidualBlock(outputs, outputs) for _ in range(blocks - 1)]
    return nn.Sequential(*layers)


class ResNet(nn.Module):
    """Maps images ``(batch, 3, 32, 32)`` to class logits ``(batch, classes)``."""

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), norm(16), nn.ReLU())
        self.layer1 = stage(16, 16, blocks=3, stride=1)
        self.layer2 = stage(16, 32, blocks=2, stride=2)
        self.layer3 = stage(32, 64, blocks=2, stride=2)
        self.layer4 = stage(64, 128, blocks=1, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        x = self.pool(x)
        x = torch.flatten(x, 1)
        x = self.fc(x)
        return x


def example() -> tuple[ResNet, tuple[torch.Tensor]]:
    """The model and one batch of random images (the default loss applies)."""
    # Seeded here as well, so the example is the same when called outside syncpass.
    torch.manual_seed(0)
    model = ResNet()
    images = torch.randn(BATCH, 3, SIZE, SIZE)
    return model, (images,)

"""A small U-Net, for ``syncpass run``: long skip connections across the network.

Three encoder levels keep their outputs; after the bottleneck, each decoder
level upsamples and concatenates the encoder output of the same resolution.
Cut anywhere between the encoder and the decoder, a pipeline stage must send
those kept outputs on to a later stage, not only the main activation.
"""

from __future__ import annotations

import torch
from torch import nn

BATCH = 8
SIZE = 32
CHANNELS = 3


def conv_block(inputs: int, outputs: int) -> nn.Sequential:
    """Two 3x3 convolutions, each followed by GroupNorm and ReLU."""
    return nn.Sequential(
        nn.Conv2d(inputs, outputs, 3, padding=1, bias=False),
        nn.GroupNorm(max(1, outputs // 8), outputs),
        nn.ReLU(),
        nn.Conv2d(outputs, outputs, 3, padding=1, bias=False),
        nn.GroupNorm(max(1, outputs // 8), outputs),
        nn.ReLU(),
    )


class UNet(nn.Module):
    """Maps images ``(batch, 3, 32, 32)`` to images of the same shape."""

    def __init__(self, channels: int = CHANNELS, width: int = 16) -> None:
        super().__init__()
        self.enc1 = conv_block(channels, width)
        self.enc2 = conv_block(width, 2 * width)
        self.enc3 = conv_block(2 * width, 4 * width)
        self.pool = nn.MaxPool2d(2)
        self.bottleneck = conv_block(4 * width, 8 * width)
        self.up3 = nn.ConvTranspose2d(8 * width, 4 * width, 2, stride=2)
        self.dec3 = conv_block(8 * width, 4 * width)
        self.up2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2)
        self.dec2 = conv_block(4 * width, 2 * width)
        self.up1 = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.dec1 = conv_block(2 * width, width)
        self.head = nn.Conv2d(width, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip1 = self.enc1(x)
        x = self.pool(skip1)
        skip2 = self.enc2(x)
        x = self.pool(skip2)
        skip3 = self.enc3(x)
        x = self.pool(skip3)
        x = self.bottleneck(x)
        x = self.up3(x)
        x = torch.cat([x, skip3], dim=1)
        x = self.dec3(x)
        x = self.up2(x)
        x = torch.cat([x, skip2], dim=1)
        x = self.dec2(x)
        x = self.up1(x)
        x = torch.cat([x, skip1], dim=1)
        x = self.dec1(x)
        x = self.head(x)
        return x


def example() -> tuple[UNet, tuple[torch.Tensor]]:
    """The model and one batch of random images (the default loss applies)."""
    # Seeded here as well, so the example is the same when called outside syncpass.
    torch.manual_seed(0)
    model = UNet()
    images = torch.randn(BATCH, CHANNELS, SIZE, SIZE)
    return model, (images,)

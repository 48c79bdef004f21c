"""A model that inherits its ``forward`` from a base class in another module (timm's DeiT,
``VisionTransformerDistilled(VisionTransformer)``): it adds a distillation token in its
own ``_embed`` and a second head in its own ``forward_head``. syncpass plans the base's
``forward`` and ``forward_features`` (``inherited_base.py``) with these overrides."""

import torch
from inherited_base import TinyBackbone
from torch import nn


class DistilledViT(TinyBackbone):
    def __init__(self, dim: int = 32, depth: int = 6, classes: int = 10) -> None:
        super().__init__(dim, depth, classes)
        self.dist_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.head_dist = nn.Linear(dim, classes)

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        token = self.dist_token.expand(x.shape[0], -1, -1)
        return torch.cat((token, x), dim=1)

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        return (self.head(x[:, 1:].mean(dim=1)) + self.head_dist(x[:, 0])) / 2


def example():
    torch.manual_seed(0)
    model = DistilledViT()
    patches, labels = torch.randn(8, 16, 48), torch.randint(0, 10, (8,))
    return model, (patches,), labels, nn.functional.cross_entropy

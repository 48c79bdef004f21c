"""The base of ``inherited_vit.py``: a timm-style vision transformer whose ``forward`` the
subclass inherits. ``forward_features`` chooses how to run its blocks (the checkpointed
branch reads ``checkpoint_sequential``, which the subclass's module does not import),
and calls ``self._embed``, which the subclass overrides."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class TinyBackbone(nn.Module):
    def __init__(self, dim: int = 32, depth: int = 6, classes: int = 10) -> None:
        super().__init__()
        self.patch_embed = nn.Linear(48, dim)
        self.blocks = nn.Sequential(*[Block(dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        self.grad_checkpointing = False

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.patch_embed(x))

    def forward_features(self, x: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        x = self._embed(x)
        if is_causal:
            raise NotImplementedError("no causal blocks here")
        elif self.grad_checkpointing and not torch.jit.is_scripting():
            x = checkpoint_sequential(self.blocks, 2, x, use_reentrant=False)
        else:
            x = self.blocks(x)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.mean(dim=1))

    def forward(self, x: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        x = self.forward_features(x, is_causal=is_causal)
        x = self.forward_head(x)
        return x

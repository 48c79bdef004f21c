"""A timm-style vision transformer: ``forward`` calls ``forward_features`` and
``forward_head``, and ``forward_features`` chooses how to run its blocks from
arguments with defaults and a flag that ``__init__`` sets."""

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x, attn_mask=None):
        return x + self.mlp(self.norm(x))


class TinyViT(nn.Module):
    def __init__(self, dim: int = 32, depth: int = 6, classes: int = 10) -> None:
        super().__init__()
        self.patch_embed = nn.Linear(48, dim)
        self.blocks = nn.Sequential(*[Block(dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        self.grad_checkpointing = False

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def forward_features(self, x, attn_mask=None, is_causal=False):
        x = self.patch_embed(x)
        if attn_mask is not None or is_causal:
            # a mask needs the blocks one by one
            for blk in self.blocks:
                x = blk(x, attn_mask=attn_mask)
        elif self.grad_checkpointing and not torch.jit.is_scripting():
            x = checkpoint_sequential(self.blocks, 2, x, use_reentrant=False)
        else:
            x = self.blocks(x)
        return self.norm(x)

    def forward_head(self, x, pre_logits: bool = False):
        x = x.mean(dim=1)
        return x if pre_logits else self.head(x)

    def forward(self, x, attn_mask=None, is_causal: bool = False):
        x = self.forward_features(x, attn_mask=attn_mask, is_causal=is_causal)
        x = self.forward_head(x)
        return x


def example():
    torch.manual_seed(0)
    model = TinyViT()
    patches, labels = torch.randn(8, 16, 48), torch.randint(0, 10, (8,))
    return model, (patches,), labels, nn.functional.cross_entropy


def example_checkpointed():
    model, args, labels, loss = example()
    model.set_grad_checkpointing()
    return model, args, labels, loss


def example_masked():
    model, (patches,), labels, loss = example()
    return model, (patches, torch.ones(16, 16, dtype=torch.bool)), labels, loss

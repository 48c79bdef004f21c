"""A layer loop no reading of the source can size (x-transformers' ``AttentionLayers``
form): the forward zips per-layer tuples it builds, reordered by an execution order,
unpacks each item into a nested tuple, advances iterators made before the loop and
keeps the first layer's output dataclass across the iterations."""

from dataclasses import dataclass

import torch
from torch import nn


def exists(val):
    return val is not None


@dataclass
class Intermediate:
    values: torch.Tensor | None = None
    kind: str | None = None


class Residual(nn.Module):
    def forward(self, out, residual):
        return out + residual


class Stack(nn.Module):
    def __init__(self, width: int = 24, depth: int = 6, rotary=None) -> None:
        super().__init__()
        self.layer_types = ("a", "f") * (depth // 2)
        self.layer_scales = [1.0 / (1 + i) for i in range(depth)]
        self.layers = nn.ModuleList(
            nn.ModuleList([nn.LayerNorm(width), nn.Linear(width, width), Residual()])
            for _ in range(depth)
        )
        self.rotary = rotary
        self.execute_order = tuple(range(depth))
        self.embed = nn.Linear(8, width)
        self.final_norm = nn.LayerNorm(width)

    def forward(self, x, order=None):
        x = self.embed(x)
        variables = (self.layer_types, self.layers, self.layer_scales)
        order = order if exists(order) else self.execute_order
        variables = tuple(tuple(variable[i] for i in order) for variable in variables)
        extra = iter((None,))
        first = None
        hiddens = []
        for ind, (kind, (norm, proj, residual), scale) in enumerate(zip(*variables, strict=True)):
            if exists(self.rotary):
                x = self.rotary(x)
            hiddens.append(x)
            out = proj(norm(x)) * scale
            if kind == "a":
                bonus = next(extra, None)
                if exists(bonus):
                    out = out + bonus
            if ind == 0:
                first = Intermediate(values=out, kind=kind)
            else:
                out = out + 0.1 * first.values
            x = residual(out, x)
        return self.final_norm(x + 0.01 * torch.stack(hiddens).mean(0))


def example():
    torch.manual_seed(0)
    return Stack(), (torch.randn(8, 5, 8),)

"""How the estimate counts FLOPs: the tally of the op being sized, and the rules' factors.

Every operation counts its forward FLOPs and the FLOPs of its backward:

* matrix products (``nn.Linear``, ``@``, ``torch.matmul``, convolutions,
  attention): ``2 * multiply-adds`` (bias additions not counted, as
  ``torch.utils.flop_counter`` counts); backward twice that;
* normalisations and softmax: 5 per element; backward twice that;
* other elementwise work (activations, dropout, ``x + y``, pooling): 1 per
  element (per window element for pooling); backward the same;
* moving data (``view``, ``transpose``, ``torch.cat``, embedding lookup): 0.

Of the backward, the part that computes the weights' gradients is tallied apart:
half the backward of a product with a weight (``nn.Linear``, ``F.linear``,
convolutions, ``nn.MultiheadAttention``'s projections), whose backward is two
products of the forward's size, one for the input's gradient and one for the
weight's. The rest (a product of two activations, normalisations, elementwise
work) computes the inputs' gradients; a normalisation's affine weights' gradients
are a reduction, not counted apart.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Backward FLOPs per forward FLOP of a matrix product: gradients for both operands.
MATMUL_BACKWARD = 2.0
#: Backward FLOPs per forward FLOP of elementwise work.
ELEMENTWISE_BACKWARD = 1.0
#: The part of a product with a weight's backward that computes the weight's gradient.
WEIGHT_SHARE = 0.5
#: FLOPs per element of a normalisation: mean, variance, normalise, scale, shift.
NORMALISE_FLOPS = 5


@dataclass
class Counter:
    """The forward and backward FLOPs of the op being sized, and the part of the backward
    that computes weights' gradients."""

    forward: float = 0.0
    backward: float = 0.0
    weight_backward: float = 0.0

    def add(self, flops: float, backward_factor: float, weight_share: float = 0.0) -> None:
        """Count ``flops`` forward, ``backward_factor`` times that backward, of which the
        part ``weight_share`` computes weights' gradients (:data:`WEIGHT_SHARE` for a
        product with a weight)."""
        self.forward += flops
        self.backward += flops * backward_factor
        self.weight_backward += flops * backward_factor * weight_share

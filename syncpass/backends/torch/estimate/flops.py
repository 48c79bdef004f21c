"""How the estimate counts FLOPs: the tally of the op being sized, and the rules' factors.

Every operation counts its forward FLOPs and the FLOPs of its backward:

* matrix products (``nn.Linear``, ``@``, ``torch.matmul``, convolutions,
  attention): ``2 * multiply-adds`` (bias additions not counted, as
  ``torch.utils.flop_counter`` counts); backward twice that;
* normalisations and softmax: 5 per element; backward twice that;
* other elementwise work (activations, dropout, ``x + y``, pooling): 1 per
  element (per window element for pooling); backward the same;
* moving data (``view``, ``transpose``, ``torch.cat``, embedding lookup): 0.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Backward FLOPs per forward FLOP of a matrix product: gradients for both operands.
MATMUL_BACKWARD = 2.0
#: Backward FLOPs per forward FLOP of elementwise work.
ELEMENTWISE_BACKWARD = 1.0
#: FLOPs per element of a normalisation: mean, variance, normalise, scale, shift.
NORMALISE_FLOPS = 5


@dataclass
class Counter:
    """The forward and backward FLOPs of the op being sized."""

    forward: float = 0.0
    backward: float = 0.0

    def add(self, flops: float, backward_factor: float) -> None:
        self.forward += flops
        self.backward += flops * backward_factor

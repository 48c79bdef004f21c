"""Estimate a model's cost file from its source alone, without running anything.

:func:`estimate_costs` reads the model class, builds the same op graph as
``syncpass profile`` (:func:`syncpass.frontend.analyse_model`, so the op ids
agree) and gives each op figures from a small abstract interpreter over the
source:

1. **Construction.** The model's ``__init__`` runs abstractly, with its
   default arguments. Values are Python numbers, strings, lists and tuples;
   standard layers (``nn.Linear``, ``nn.Conv2d``, ``nn.LayerNorm``, ...,
   ``nn.MultiheadAttention``), containers (``nn.Sequential``,
   ``nn.ModuleList``, ``nn.ModuleDict``) and instances of the file's own
   classes, whose ``__init__`` runs the same way. Module-level constants, the
   file's helper functions (``def stage(...): return nn.Sequential(*layers)``),
   comprehensions, ``if`` on known values and simple arithmetic are
   evaluated; names resolve through the file's imports, so ``torch.nn.Linear``,
   ``nn.Linear`` and ``from torch.nn import Linear`` are one layer. The lengths
   of the layer containers the forward loops over come from here.
2. **Shapes.** The forward runs abstractly on tensors that carry only a shape
   and a kind (float, int, bool): the inputs get ``input_shapes``; each layer,
   torch function, tensor method and operator gives its output shape; a call
   of one of the file's own modules runs that module's forward the same way.
3. **Counts.** Every operation counts forward FLOPs and the FLOPs of its
   backward:

   * matrix products (``nn.Linear``, ``@``, ``torch.matmul``, convolutions,
     attention): ``2 * multiply-adds`` (bias additions not counted, as
     ``torch.utils.flop_counter`` counts); backward twice that;
   * normalisations and softmax: 5 per element; backward twice that;
   * other elementwise work (activations, dropout, ``x + y``, pooling):
     1 per element (per window element for pooling); backward the same;
   * moving data (``view``, ``transpose``, ``torch.cat``, embedding lookup): 0.

   An op's ``compute_s`` is its forward FLOPs over the hardware's
   ``flops_per_s`` (:data:`DEFAULT_FLOPS_PER_S` when the hardware gives none,
   and then the cost file's hardware records that rate, so ``--hardware``
   scales from it), ``backward_s`` likewise. ``backward_input_s``, the part of
   the backward that computes the inputs' gradients (torch's ``I``), is the
   backward less half of each product with a weight (the weight's gradient),
   and 0 for an op none of whose inputs needs a gradient (the forward's inputs
   need none; what an op writes needs one when what it reads does or it calls a
   submodule with parameters). ``param_bytes`` are the parameters
   of the submodules the op calls, each counted once at its first use, as
   ``syncpass profile`` attributes them; ``out_bytes`` the tensors the op
   writes; a cut's ``live_bytes`` the tensors its live names hold (one tensor
   under two names counts once). Float tensors take ``dtype_bytes`` per
   element, integer tensors 8 and boolean ones 1.

**Fallback.** An op the interpreter cannot size (an unknown layer or
function, a shape it cannot follow, a branch on a tensor's value) is listed in
:attr:`StaticEstimate.unsized` with its ``file:line`` and the reason, and
gets: forward and backward FLOPs (hence compute) equal to the **median** of
the sized ops'; every name it writes holds a tensor of the **shape of its
first input** that has one (else of the last activation sized before it);
its parameters are still those of the constructors it calls when they
resolve (zero when they do not). The cost file's notes say how many ops
were unsized.

The model is built with its ``__init__``'s default arguments (an argument
without a default is an unknown value, so what it sizes is unsized). With no
class name, the model is the file's one model class that no other class of the
file builds (``TransformerLM`` beside its ``Block``). ``training`` sets the
memory multiplier (4 for weights, gradients and two Adam moments; 1 for
inference) and ``self.training`` in the source.

The package imports neither torch nor the user's code. Its modules, from the
bottom up:

* :mod:`.values`: the abstract values and the exceptions that steer the
  interpreter;
* :mod:`.flops` and :mod:`.shapes`: the FLOP tally and shape rules shared by
  the parts above them;
* :mod:`.layers`, :mod:`.containers` and :mod:`.tensors`: torch's layers,
  containers and tensor functions, each looked up by name in a table;
* :mod:`.interpreter`: the Python evaluator that dispatches to them;
* :mod:`.inputs` and :mod:`.forward`: the forward's inputs, and the forward run
  op by op;
* :mod:`.assemble`: the cost file, :func:`estimate_costs`.
"""

from __future__ import annotations

from syncpass.backends.torch.estimate.assemble import (
    DEFAULT_FLOPS_PER_S,
    StaticEstimate,
    UnsizedOp,
    estimate_costs,
)
from syncpass.backends.torch.estimate.inputs import parse_input_shapes

__all__ = [
    "DEFAULT_FLOPS_PER_S",
    "StaticEstimate",
    "UnsizedOp",
    "estimate_costs",
    "parse_input_shapes",
]

"""Write activation checkpointing into an eager stage's statements (``rewrite --recompute``).

Each op the plan recomputes is a call in the stage's slice of ``forward``; it becomes
``torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False, **kwargs)``, one line
with a comment that says why; a loop of which only some blocks recompute is split into
sub-slices (:mod:`syncpass.transformers.checkpoints` finds the calls and writes the
lines, this module says how torch wraps one).

Non-reentrant checkpointing is exact: the forward run again in the backward computes the
same values (it replays the random state too), so ``run --verify`` compares as before.
The stage classes are removed whole, so removing the sync points removes these too.
Nothing here imports torch.
"""

from __future__ import annotations

import libcst as cst

from syncpass.transformers.checkpoints import CheckpointForm, is_self_path
from syncpass.transformers.common import one_argument_a_line

#: The function the stages checkpoint with (the model's file binds ``torch``).
CHECKPOINT = "torch.utils.checkpoint.checkpoint"


def _torch_checkpoint(call: cst.Call, exploded: bool, rebound: frozenset[str]) -> cst.Call:
    """``checkpoint(fn, *args, use_reentrant=False, **kwargs)`` of ``fn(*args, **kwargs)``
    (its arguments are passed, none closed over: ``rebound`` needs nothing)."""
    keyword = cst.Arg(
        value=cst.Name("False"),
        keyword=cst.Name("use_reentrant"),
        equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""),
            whitespace_after=cst.SimpleWhitespace(""),
        ),
    )
    args = [arg.with_changes(comma=cst.MaybeSentinel.DEFAULT) for arg in call.args]
    star = [arg for arg in args if arg.star == "**"]
    plain = [arg for arg in args if arg.star != "**"]
    wrapped = cst.Call(
        func=cst.parse_expression(CHECKPOINT), args=[cst.Arg(call.func), *plain, keyword, *star]
    )
    return one_argument_a_line(wrapped) if exploded else wrapped


#: torch's eager stages: a submodule's call, checkpointed without reentrancy.
TORCH_STAGES = CheckpointForm("the stages checkpoint", _torch_checkpoint, is_self_path)

"""Running a rewritten model as a real pipeline: ``syncpass run``.

The model's forward carries ``torch.distributed.pipelining.pipe_split()`` calls;
``syncpass run`` starts one local process per stage, builds the stages with
``torch.distributed.pipelining`` as a training script would, runs a few
training steps, measures each stage and, with ``--verify``, checks the loss and
every gradient against the unsplit model.

Modules: :mod:`.contracts` (what the processes exchange), :mod:`.launch`
(starting, watching and stopping the processes), :mod:`.worker` (one stage's
process), :mod:`.verify` (the unsplit reference and the comparison),
:mod:`.render` (the report and its JSON form) and :mod:`.command` (the
command-line entry). Only :mod:`.worker` and :mod:`.verify` import torch.
"""

from __future__ import annotations

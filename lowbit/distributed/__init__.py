"""lowbit on torch.distributed's engines: DDP and FSDP2, rank-consistent recipe state, FP8 all-gather.

``prepare(model, group=None, fp8_all_gather=False)``, once, after ``lowbit.convert`` (which calls
it by itself when a process group is initialised) and before ``fully_shard`` / DDP:

* checks that a process group is initialised and that every rank of ``group`` converted the same
  layers with the same recipe (clear errors otherwise; a collective: every rank calls it);
* delayed scaling: one all-reduce(MAX) of every amax history a step, with no call to remember
  (``sync.StepSync``: at the end of each backward; the module docstring of ``sync`` says when
  exactly), and a cold start primed from amaxes reduced across ranks (``sync.ColdStart``): every
  rank holds the same histories and scales, equal to one process seeing the whole batch;
* ``fp8_all_gather=True``: the weights of tensorwise (delayed, current) and 128x128-blockwise
  Linear layers become ``FP8GatherWeight``: under FSDP2 each rank casts its shard and FP8 is
  all-gathered (``fsdp``). For FSDP2 only: DDP needs plain parameters (keep the default there).

``group``: the data-parallel group (default: all ranks). Under tensor parallelism pass a group
that also spans the TP ranks (the default does): each rank records the amax of its own shard of a
weight, activation or gradient, and the MAX over the group is the amax of the whole tensor.
A lowbit ``Linear`` computes on plain local tensors: a TP shard is a Linear of the shard's shape
(Megatron style); DTensor parallel styles that hand it DTensors are not supported.

What other recipes need: none of their scales is state (current, rowwise, block, MX and NV scale
each rank's own activation and gradient tensors, as TransformerEngine and torchao do; a weight is
cast after FSDP2's all-gather, whole, or by the FP8 all-gather above); NVFP4's stochastic-rounding
counters advance alike on every rank. So a data-parallel run of those recipes equals one process
accumulating the ranks' micro-batches (their wgrad tiles run along the tokens), while delayed
scaling equals one process on the whole batch (tests: within fp32 reordering, 1e-5).

Practical notes: gradient accumulation syncs at every backward (one collective a micro-batch);
DDP's ``broadcast_buffers=True`` (its default) re-sends the recipe buffers, which are equal on
every rank already (``broadcast_buffers=False`` saves that collective). Checkpoints: the recipe
state is module buffers, so ``torch.distributed.checkpoint`` saves and loads it with the model
(replicated, one copy) and resumes bit for bit. Tested eager; the FP8 all-gather weight is not
traced by torch.compile (the Linear's custom op takes plain tensors).
"""
from __future__ import annotations

from torch import nn

from .fsdp import FP8GatherWeight, WeightGather, gathers_fp8
from .group import check_same_recipes, lowbit_layers, refuse_dtensors, require_group
from .sync import ColdStart, StepSync

__all__ = ["prepare", "FP8GatherWeight"]

_ATTR = "_lowbit_distributed"  # on the prepared root: (StepSync, ColdStart, WeightGather or None)


def prepare(model: nn.Module, group=None, *, fp8_all_gather: bool = False) -> nn.Module:
    """Make a converted model's recipe state consistent across the ranks of ``group`` (module
    docstring); idempotent (a second call re-reads the layers, may add ``fp8_all_gather``)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"prepare takes an nn.Module, got {type(model).__name__}")
    group = require_group(group)
    check_same_recipes(model, group)
    old = getattr(model, _ATTR, None)
    gather = old[2] if old else None
    if old:
        old[0].remove()
        old[1].remove()
    if fp8_all_gather:
        gather = gather or WeightGather()
        _wrap_weights(model, gather)
    sync = StepSync(model, group)
    if gather is not None:
        sync.on_step.append(gather.new_step)
        sync.on_first_forward.append(gather.require_sharded)
    refuse_dtensors(model)  # (before ColdStart's hooks, after FSDP2's, which come first)
    setattr(model, _ATTR, (sync, ColdStart(model, group), gather))
    return model


def _wrap_weights(model: nn.Module, gather: WeightGather) -> None:
    from torch.distributed.tensor import DTensor
    for name, mod in lowbit_layers(model):
        if not gathers_fp8(mod) or isinstance(mod.weight, FP8GatherWeight):
            continue
        if isinstance(mod.weight, DTensor):
            raise RuntimeError(f"lowbit.distributed.prepare(fp8_all_gather=True): {name} is sharded already; "
                               "call it before fully_shard")
        w = mod.weight
        mod.weight = nn.Parameter(FP8GatherWeight(w.detach(), gather), requires_grad=w.requires_grad)
        gather.add(mod)

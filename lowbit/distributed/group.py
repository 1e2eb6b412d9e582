"""Checks before lowbit couples ranks: the process group is initialised, every rank converted the
same layers with the same recipe (one ``all_gather_object`` at set-up), no layer computes on
DTensors (checked at each layer's first forward)."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch.distributed as dist
from torch import nn

from ..nn.linear import LowbitModule
from ..nn.spec import decode

__all__ = ["require_group", "check_same_recipes", "lowbit_layers", "refuse_dtensors", "all_reduce_max"]


def require_group(group: Optional["dist.ProcessGroup"], what: str = "lowbit.distributed.prepare"):
    """``group`` (None: the default group) if torch.distributed is initialised, else a clear error."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{what} needs an initialised process group: call "
                           "torch.distributed.init_process_group(...) (or torchrun) first; "
                           "a single process needs no preparation")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{what}: group must be a torch.distributed.ProcessGroup or None, got {group!r}")
    return group


def lowbit_layers(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LowbitModule)]


def check_same_recipes(model: nn.Module, group=None) -> None:
    """ValueError on every rank unless all ranks of ``group`` hold the same lowbit layers (names)
    with the same recipes: their recipe state would otherwise be reduced across unlike layers."""
    mine = [(name, mod.lowbit_state.recipe_key) for name, mod in lowbit_layers(model)]
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    ref = everyone[0]
    bad = []
    for rank, theirs in enumerate(everyone[1:], start=1):
        if theirs == ref:
            continue
        a, b = dict(ref), dict(theirs)
        for name in sorted(set(a) | set(b), key=lambda n: (n not in a, n)):
            if a.get(name) != b.get(name):
                fmt = lambda k: "not converted" if k is None else repr(decode(k))  # noqa: E731
                bad.append(f"  {name or '<root>'}: rank 0 {fmt(a.get(name))}, rank {rank} {fmt(b.get(name))}")
    if bad:
        more = f"\n  ... and {len(bad) - 8} more" if len(bad) > 8 else ""
        raise ValueError("lowbit.distributed: the ranks were converted differently; every rank must convert "
                         "the same layers with the same recipe:\n" + "\n".join(bad[:8]) + more)


def refuse_dtensors(model: nn.Module) -> None:
    """A one-shot check before each lowbit layer's first forward: a clear error if the layer
    would compute on DTensors (tensor parallelism by DTensor parallel styles; lowbit's ops run on
    local tensors: shard a layer as a Linear of the shard's shape instead). FSDP2 hands the layer
    plain unsharded weights, so it passes."""
    from torch.distributed.tensor import DTensor

    def check(mod, args):
        handles.pop(id(mod)).remove()
        if isinstance(mod.weight, DTensor) or (args and isinstance(args[0], DTensor)):
            raise NotImplementedError(
                f"lowbit {type(mod).__name__}: the weight or input is a DTensor (tensor parallelism by DTensor "
                "parallel styles), but lowbit layers compute on local tensors; give each rank a lowbit Linear of its "
                "shard's shape (Megatron style): lowbit.distributed reduces the shards' amaxes over the group")

    handles = {id(m): m.register_forward_pre_hook(check) for _, m in lowbit_layers(model)}


def all_reduce_max(group):
    """``buf -> all_reduce(buf, MAX)`` over ``group``, in place."""
    def reduce(buf):
        dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=group)
    return reduce

"""Delayed scaling state: an amax history and the scale derived from it, as module buffers.

``update(amax)`` (tensor ops only, no host sync) shifts ``amax`` into ``amax_history[0]`` and sets
``scale = A / fmax * 2^margin`` with ``A = max(history)`` or ``history[0]``. A non-finite amax is
recorded as 0, and an ``A`` of 0 keeps the previous scale: a zero or non-finite amax never
replaces a good scale. The buffers are saved in the state_dict; across data-parallel ranks the
history is reduced with all-reduce(MAX) by ``sync`` (a no-op without an initialised process group).
"""
from __future__ import annotations

import torch
from torch import nn

from ..dtypes.formats import get_format
from .recipes import Delayed
from .scales import div_exact

__all__ = ["DelayedScalingState"]


class DelayedScalingState(nn.Module):
    def __init__(self, recipe: Delayed, fmt):
        super().__init__()
        if not isinstance(recipe, Delayed):
            raise TypeError(f"DelayedScalingState needs a Delayed recipe, got {type(recipe).__name__}")
        self.recipe = recipe
        self.fmt = get_format(fmt)
        self.register_buffer("amax_history", torch.zeros(recipe.history_len, dtype=torch.float32))
        self.register_buffer("scale", torch.ones((), dtype=torch.float32))

    @torch.no_grad()
    def update(self, amax: torch.Tensor) -> None:
        amax = amax.detach().to(device=self.amax_history.device, dtype=torch.float32).reshape(())
        amax = torch.where(torch.isfinite(amax), amax, torch.zeros_like(amax))
        hist = torch.cat((amax.reshape(1), self.amax_history[:-1]))
        a = hist.amax() if self.recipe.amax_algo == "max" else hist[0]
        new = div_exact(a, self.fmt.max) * (2.0 ** self.recipe.margin)
        good = (a > 0) & torch.isfinite(new) & (new > 0)
        self.scale.copy_(torch.where(good, new, self.scale))
        self.amax_history.copy_(hist)

    @torch.no_grad()
    def sync(self, group=None) -> None:
        """all-reduce(MAX) of the history across ranks, then recompute the scale from it."""
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            return
        dist.all_reduce(self.amax_history, op=dist.ReduceOp.MAX, group=group)
        a = self.amax_history.amax() if self.recipe.amax_algo == "max" else self.amax_history[0]
        new = div_exact(a, self.fmt.max) * (2.0 ** self.recipe.margin)
        self.scale.copy_(torch.where(a > 0, new, self.scale))

    def extra_repr(self) -> str:
        return f"fmt={self.fmt.name}, history_len={self.recipe.history_len}, algo={self.recipe.amax_algo}"

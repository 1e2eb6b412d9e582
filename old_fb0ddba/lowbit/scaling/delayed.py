"""Delayed scaling state: an amax history and the scale derived from it, as module buffers.

``update(amax)`` (tensor ops only, no host sync) shifts ``amax`` into ``amax_history[0]`` and sets
``scale = A / fmax * 2^margin`` with ``A = max(history)`` or ``history[0]``. A non-finite amax is
recorded as 0, and an ``A`` of 0 keeps the previous scale: a zero or non-finite amax never
replaces a good scale. The buffers are saved in the state_dict; across data-parallel ranks the
history is reduced with all-reduce(MAX) by ``sync`` (a no-op without an initialised process group).

Cold start (``recipe.amax_init``): ``prime(x)`` sets ``scale = amax(x) / fmax * 2^margin`` (same
rule, x's own finite amax) before the first cast, once. ``primed`` is a plain Python bool, not a
tensor: reading it never syncs a device, torch.compile guards on it (one recompile when it turns
True) and a CUDA graph captured after the first step holds no cold-start branch and no CPU tensor.
It is not saved: loading a state_dict sets it to ``any(amax_history > 0)``, which is what it was
unless every amax recorded so far was 0 (then the next tensor is primed again).
"""
from __future__ import annotations

import torch
from torch import nn

from ..dtypes.formats import get_format
from .blocks import TENSOR, block_amax
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
        self.primed = False  # a Python bool on purpose (module docstring)

    @classmethod
    def over(cls, recipe: Delayed, fmt, amax_history: torch.Tensor, scale: torch.Tensor) -> "DelayedScalingState":
        """A state over existing tensors (they are its buffers, updated in place): what the
        Linear's ops build per call, without allocating the buffers ``__init__`` would."""
        if not isinstance(recipe, Delayed):
            raise TypeError(f"DelayedScalingState needs a Delayed recipe, got {type(recipe).__name__}")
        st = cls.__new__(cls)
        nn.Module.__init__(st)
        st.recipe, st.fmt = recipe, get_format(fmt)
        st._buffers["amax_history"], st._buffers["scale"] = amax_history, scale
        st.primed = False
        return st

    def _scale_from(self, a: torch.Tensor) -> None:
        new = div_exact(a, self.fmt.max) * (2.0 ** self.recipe.margin)
        good = (a > 0) & torch.isfinite(new) & (new > 0)
        self.scale.copy_(torch.where(good, new, self.scale))

    @torch.no_grad()
    def prime(self, x: torch.Tensor) -> None:
        """Before the first cast: the scale from x's own finite amax (no-op once primed)."""
        if self.primed:
            return
        self._scale_from(block_amax(x.detach(), TENSOR).to(device=self.scale.device, dtype=torch.float32))
        self.primed = True

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if self.amax_history.device.type != "meta":
            self.primed = bool((self.amax_history > 0).any())

    @torch.no_grad()
    def update(self, amax: torch.Tensor) -> None:
        amax = amax.detach().to(device=self.amax_history.device, dtype=torch.float32).reshape(())
        amax = torch.where(torch.isfinite(amax), amax, torch.zeros_like(amax))
        hist = torch.cat((amax.reshape(1), self.amax_history[:-1]))
        self._scale_from(hist.amax() if self.recipe.amax_algo == "max" else hist[0])
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

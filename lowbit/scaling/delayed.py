"""Delayed scaling state: an amax history and the scale derived from it, as module buffers.

``update(amax)`` (tensor ops only, no host sync) shifts ``amax`` into ``amax_history[0]`` and sets
``scale = A / fmax * 2^margin`` with ``A = max(history)`` or ``history[0]``. A non-finite amax is
recorded as 0, and an ``A`` of 0 keeps the previous scale: a zero or non-finite amax never
replaces a good scale. An empty tensor records nothing (``FP8Tensor.from_float`` skips the
update, ``prime`` does not prime): no amax was observed. The buffers are saved in the state_dict.
Across data-parallel ranks
``reduce_histories(states, all_reduce)`` reduces the histories of many states in ONE collective
(flattened into one buffer; ``all_reduce`` is MAX in place, supplied by ``lowbit.distributed``)
and sets every scale from its reduced history by the same rule.

Cold start (``recipe.amax_init``): ``prime(x)`` sets ``scale = amax(x) / fmax * 2^margin`` (same
rule, x's own finite amax) before the first cast, once; ``prime_amax(a)`` does the same from a
given amax (one all-reduced across ranks, so that every rank primes alike). ``primed`` is a
plain Python bool, not a tensor: reading it never syncs a device, torch.compile guards on it (one
recompile when it turns True) and a CUDA graph captured after the first step holds no cold-start
branch and no CPU tensor.
It is not saved: loading a state_dict sets it to ``any(amax_history > 0)``, which is what it was
unless every amax recorded so far was 0 (then the next tensor is primed again).
"""
from __future__ import annotations

import itertools
from typing import Callable, Sequence

import torch
from torch import nn

from ..dtypes.formats import get_format
from ..dtypes.blocks import TENSOR, block_amax
from .recipes import Delayed

__all__ = ["DelayedScalingState", "reduce_histories"]


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
        fmax = torch.full((), self.fmt.max, dtype=torch.float32, device=a.device)
        self.scale.copy_(_delayed_scale(a, fmax, 2.0 ** self.recipe.margin, self.scale))

    @torch.no_grad()
    def prime(self, x: torch.Tensor, force: bool = False) -> None:
        """Before the first cast: the scale from x's own finite amax (no-op once primed, unless
        ``force``: the caller tracks the cold start itself, as ``lowbit.nn.LinearState`` does; an
        empty x primes nothing: it stays unprimed)."""
        if (not self.primed or force) and x.numel():
            self.prime_amax(block_amax(x.detach(), TENSOR), force)

    @torch.no_grad()
    def prime_amax(self, amax: torch.Tensor, force: bool = False) -> None:
        """``prime`` from a given finite amax (no-op once primed, unless ``force``)."""
        if self.primed and not force:
            return
        self._scale_from(amax.to(device=self.scale.device, dtype=torch.float32).reshape(()))
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

    def extra_repr(self) -> str:
        return f"fmt={self.fmt.name}, history_len={self.recipe.history_len}, algo={self.recipe.amax_algo}"


def _delayed_scale(a: torch.Tensor, fmax: torch.Tensor, factor, old: torch.Tensor) -> torch.Tensor:
    """The delayed rule, elementwise: ``a / fmax * factor`` (``factor = 2^margin``) where it is a
    positive finite scale from a positive amax ``a``, else ``old``. ``fmax`` is a tensor: one
    IEEE division on every device (``scales.div_exact``)."""
    new = a / fmax * factor
    good = (a > 0) & torch.isfinite(new) & (new > 0)
    return torch.where(good, new, old)


@torch.no_grad()
def reduce_histories(states: Sequence[DelayedScalingState], all_reduce: Callable[[torch.Tensor], None]) -> None:
    """``all_reduce(buf)`` (in place) of every state's ``amax_history``, flattened into ONE buffer
    (one collective for a whole model), then each ``scale`` from its reduced history by the rule of
    ``update``: ``A = max(history)`` or ``history[0]``, ``scale = A / fmax * 2^margin``, the old
    scale kept where A is 0. Any mix of recipes; all states on one device. No host sync: states
    are grouped by (length, algo, format, margin), a few kernels a group (typically two)."""
    def kind(st):
        return st.recipe.history_len, st.recipe.amax_algo, st.fmt.max, st.recipe.margin

    states = sorted(states, key=kind)  # each kind is one contiguous run of buf
    if not states:
        return
    hists, scales = [st.amax_history for st in states], [st.scale for st in states]
    buf = torch.cat(hists)
    all_reduce(buf)
    torch._foreach_copy_(hists, list(buf.split([h.numel() for h in hists])))
    old, new, start, first = torch.stack(scales), [], 0, 0
    for (n, algo, fmax, margin), group in itertools.groupby(states, key=kind):
        k = len(list(group))
        rows = buf[start: start + n * k].view(k, n)
        a = rows[:, 0] if algo == "most_recent" else rows.amax(dim=1)
        fmax_t = torch.full((), fmax, dtype=torch.float32, device=buf.device)
        new.append(_delayed_scale(a, fmax_t, 2.0 ** margin, old[first: first + k]))
        start, first = start + n * k, first + k
    torch._foreach_copy_(scales, list(torch.cat(new).unbind()))

"""Rank-consistent delayed scaling: one all-reduce(MAX) of every amax history a step, and a cold
start primed from amaxes reduced across ranks.

``StepSync`` (hooks on the prepared root module) calls ``sync()``, which all-reduces the amax
histories of every delayed layer in ONE collective (``lowbit.scaling.delayed.reduce_histories``)
and sets every scale from its reduced history, so every rank holds the same histories and scales:

* at the end of each backward pass through the model (an autograd-engine callback, queued when
  the backward reaches the model's outputs): after every amax of the step (input and weight in
  the forward, output gradient in the backward) is recorded, before the optimizer step and the
  next forward; ``state_dict()`` between steps is the same on every rank;
* at the end of a forward under ``torch.no_grad`` / ``inference_mode`` (no backward follows);
* at the start of a forward if an earlier forward's amaxes were never synced (its backward did
  not run, two forwards precede one backward, or its outputs hold no tensor that needs a
  gradient and that ``torch.utils._pytree`` can find): no cast ever uses an unsynced scale.

A training loop (forward, backward, step) pays one collective per step. The MAX of the ranks'
amaxes is the amax of the whole batch (data parallel) or of the whole tensor (a weight sharded by
FSDP or by tensor parallelism: each rank records the amax of its shard), so the histories and
scales equal those of one process that sees everything.

``ColdStart`` (hooks on each delayed layer with ``amax_init``): the first cast of each role takes
its scale from the amax all-reduced across ranks (input and weight in one collective before the
layer's first forward; the output gradient in the first backward, from a hook on the layer's
output), not from the rank's own tensor: step 0 matches one process too. One collective per
layer and role, on the first step only; afterwards the hooks return at a flag check.
"""
from __future__ import annotations

import weakref
from typing import List

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from ..dtypes.fp8_tensor import FP8Tensor
from ..scaling.blocks import TENSOR, block_amax
from ..scaling.delayed import reduce_histories
from ..scaling.recipes import ROLES, Delayed
from .group import all_reduce_max, lowbit_layers

__all__ = ["StepSync", "ColdStart"]


class StepSync:
    """The step boundary of one prepared model (module docstring). ``on_step`` callables (the FP8
    all-gather's per-step casts) run after each sync, ``on_first_forward`` ones (checks) once."""

    def __init__(self, root: nn.Module, group=None):
        self.group = group
        self.pending = False
        self.on_step: List = []
        self.on_first_forward: List = []
        self._layers = [weakref.ref(m) for _, m in lowbit_layers(root) if isinstance(m.recipe, Delayed)]
        self._handles = [root.register_forward_pre_hook(self._pre),
                         root.register_forward_hook(self._post)]

    def states(self) -> list:
        return [getattr(m.lowbit_state, role) for m in (r() for r in self._layers) if m is not None
                for role in ROLES]

    @torch.no_grad()
    def sync(self) -> None:
        self.pending = False
        states = self.states()
        if states:
            reduce_histories(states, all_reduce_max(self.group))
        for fn in self.on_step:
            fn()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()

    # ---- hooks ----------------------------------------------------------------------------
    def _pre(self, module, args):
        if self.on_first_forward:
            for check in self.on_first_forward:
                check()
            self.on_first_forward.clear()
        if self.pending:
            self.sync()

    def _post(self, module, args, out):
        tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not tensors:  # no backward through the outputs: sync now (or, under grad mode with
            if torch.is_grad_enabled():  # outputs pytree cannot see into, before the next forward)
                self.pending = True
            else:
                self.sync()
            return
        self.pending = True
        torch.autograd.graph.register_multi_grad_hook(tensors, self._arm, mode="any")

    def _arm(self, grad) -> None:
        torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)

    def _end_of_backward(self) -> None:
        if self.pending:
            self.sync()


def _amax(t: torch.Tensor) -> torch.Tensor:
    return block_amax(t.detach(), TENSOR).float().reshape(())


def _autocast(x: torch.Tensor) -> torch.Tensor:
    """x as ``lowbit.nn.functional.linear`` casts it under autocast (its amax is what it primes from)."""
    dev = x.device.type
    if dev in ("cuda", "cpu") and torch.is_autocast_enabled(dev):
        return x.to(torch.get_autocast_dtype(dev))
    return x


class ColdStart:
    """Cold-start hooks on the delayed ``amax_init`` layers of a prepared model (module docstring).

    The gradient role: the layer's pre-forward hook marks the grad state primed (so the op does
    not prime it from this rank's gradient) and, in the first forward that autograd records, a
    hook on the layer's output primes it from the all-reduced amax of that output's gradient,
    just before the layer's own backward: the application the op would have primed."""

    def __init__(self, root: nn.Module, group=None):
        self.reduce = all_reduce_max(group)
        self._claimed = set()
        self._handles = []
        for _, m in lowbit_layers(root):
            if isinstance(m.recipe, Delayed) and m.recipe.amax_init:
                self._handles += [m.register_forward_pre_hook(self._pre), m.register_forward_hook(self._post)]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()

    def _pre(self, mod, args):
        st = mod.lowbit_state
        cold_x = not st.input.primed and bool(args) and isinstance(args[0], torch.Tensor)
        cold_w = not st.weight.primed and not isinstance(mod.weight, FP8Tensor)  # (FP8: primed by the gather)
        if cold_x or cold_w:
            zero = st.input.scale.new_zeros(())
            a = torch.stack([_amax(_autocast(args[0])).to(zero.device) if cold_x else zero,
                             _amax(mod.weight).to(zero.device) if cold_w else zero])
            self.reduce(a)
            if cold_x:
                st.input.prime_amax(a[0])
            if cold_w:
                st.weight.prime_amax(a[1])
        if not st.grad.primed and torch.is_grad_enabled():
            st.grad.primed = True  # claimed: primed by _post's hook with the all-reduced amax
            self._claimed.add(id(mod))

    def _post(self, mod, args, out):
        if id(mod) not in self._claimed:
            return
        self._claimed.discard(id(mod))
        st = mod.lowbit_state.grad
        if not (isinstance(out, torch.Tensor) and out.requires_grad):
            st.primed = False  # no backward will run: not primed after all
            return

        def prime(g):
            a = _amax(g).to(st.scale.device)
            self.reduce(a)
            st.primed = False
            st.prime_amax(a)

        out.register_hook(prime)

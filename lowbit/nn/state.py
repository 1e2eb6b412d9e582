"""``LinearState``: the recipe state one low-precision Linear carries, as a child module.

* ``Delayed``: three ``DelayedScalingState`` children ``input``, ``weight``, ``grad`` (buffers
  ``amax_history`` and ``scale``, saved in the state_dict as ``<layer>.lowbit_state.<role>.*``;
  the Python flag ``primed`` of the cold start, derived from the history when loaded; the ops
  are told which roles to prime, ``cold_start``, and the flags are set by ``mark_primed``).
* ``NV``: the 16 Hadamard signs (a non-persistent buffer: they follow from a fixed seed) and, with
  stochastic rounding, the key of its counter-based draws (child ``sr``, ``lowbit.dtypes.Philox``):
  a non-persistent int64 buffer ``(seed, step)`` on the layer's device that the backward reads
  and advances there (no host sync, and a CUDA graph replays it), its step saved through
  ``get_extra_state`` as ``<layer>.lowbit_state.sr._extra_state``. ``seed`` tells the layers apart.
* Other recipes are stateless.

``reset()`` puts every buffer back to its initial value (use it after ``to_empty()`` on a model
converted on the meta device).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import nn

from ..scaling.delayed import DelayedScalingState
from ..scaling.hadamard import random_signs
from ..scaling.recipes import NV, ROLES, Delayed, Recipe
from .spec import encode

__all__ = ["LinearState", "SRCounter", "HADAMARD_SEED"]

HADAMARD_SEED = 0  # one fixed sign vector for every layer, as in NVIDIA's NVFP4 recipe


class LinearState(nn.Module):
    def __init__(self, recipe: Recipe, seed: int = 0, device=None):
        super().__init__()
        self.recipe = recipe
        self.recipe_key = encode(recipe)
        self.kind = recipe.kind
        self.delayed = isinstance(recipe, Delayed)
        self.seed = int(seed)
        if isinstance(recipe, Delayed):
            for role in ROLES:
                self.add_module(role, DelayedScalingState(recipe, recipe.format(role)).to(device))
        self.has_signs = isinstance(recipe, NV) and recipe.hadamard_wgrad
        if self.has_signs:
            self.register_buffer("hadamard_signs", random_signs(HADAMARD_SEED, device), persistent=False)
        if isinstance(recipe, NV) and recipe.sr_grads:
            self.sr = SRCounter(self.seed, device)

    @property
    def sr_key(self) -> Optional[torch.Tensor]:
        """The stochastic-rounding key ``(seed, step)``; None for recipes without SR."""
        return self.sr.key if hasattr(self, "sr") else None

    # ---- what the ops take -----------------------------------------------------------------
    def tensors(self) -> List[torch.Tensor]:
        """Delayed: (amax_history, scale) of input, weight, grad in that order; else []."""
        if not isinstance(self.recipe, Delayed):
            return []
        states = [getattr(self, role) for role in ROLES]
        return [t for st in states for t in (st.amax_history, st.scale)]

    def cold_start(self) -> Tuple[bool, bool, bool]:
        """Which of input, weight, grad the next step primes (``recipe.amax_init``, not yet primed).
        The grad is primed by the backward of the first forward autograd records: for a layer applied
        twice in its first step, the backward of the first application (the one that runs last)."""
        if not (isinstance(self.recipe, Delayed) and self.recipe.amax_init):
            return (False, False, False)
        return tuple(not getattr(self, role).primed for role in ROLES)

    def mark_primed(self, roles: Tuple[bool, bool, bool]) -> None:
        """Set the flags of the roles a step primed (Python attributes: torch.compile records the
        change as a side effect and recompiles once for the primed state)."""
        for role, done in zip(ROLES, roles):
            if done:
                getattr(self, role).primed = True

    def signs(self) -> Optional[torch.Tensor]:
        return self.hadamard_signs if self.has_signs else None

    @torch.no_grad()
    def reset(self) -> None:
        if isinstance(self.recipe, Delayed):
            for role in ROLES:
                getattr(self, role).amax_history.zero_()
                getattr(self, role).scale.fill_(1.0)
                getattr(self, role).primed = False
        if self.has_signs:
            self.hadamard_signs.copy_(random_signs(HADAMARD_SEED, self.hadamard_signs.device))
        if hasattr(self, "sr"):
            self.sr.reset()

    def extra_repr(self) -> str:
        return f"recipe={self.recipe!r}, seed={self.seed}"


class SRCounter(nn.Module):
    """The key ``(seed, step)`` of a layer's stochastic rounding (``lowbit.dtypes.Philox``): an int64
    buffer on the layer's device; the step is checkpointed as extra state (the seed comes from the
    layer)."""

    def __init__(self, seed: int = 0, device=None):
        super().__init__()
        self.seed = int(seed)
        self.register_buffer("key", torch.tensor([self.seed, 0], dtype=torch.int64, device=device), persistent=False)

    @property
    def step(self) -> torch.Tensor:
        """The step counter: a view of ``key`` (in-place changes set it)."""
        return self.key[1]

    @torch.no_grad()
    def reset(self) -> None:
        self.key.copy_(torch.tensor([self.seed, 0], dtype=torch.int64))

    def get_extra_state(self):
        return {"step": 0 if self.key.is_meta else int(self.step)}  # (a meta layer has no step yet)

    def set_extra_state(self, state) -> None:
        self.step.fill_(int(state["step"]))

    def extra_repr(self) -> str:
        return f"seed={self.seed}"

"""Low-precision training Linear layers (``y = x W^T + b`` through ``lowbit.nn.functional.linear``).

* ``Linear``: an ``nn.Linear`` (weight ``(out, in)``) whose forward and backward GEMMs run in the
  recipe's formats. ``Linear.from_float(linear, recipe, backend, seed)`` wraps an existing
  ``nn.Linear`` *sharing its Parameter objects* (an optimizer built before the swap keeps working,
  nothing is copied, a meta-device layer stays on meta); ``to_float()`` gives the original class
  back with the same parameters.
* ``TransposedLinear``: the same for Hugging Face's ``Conv1D`` layout (GPT-2): weight
  ``(in, out)``, ``y = x W + b``.

Recipe state lives in the child ``lowbit_state`` (``LinearState``), so a converted layer's
state_dict has the plain layer's keys (``weight``, ``bias``) plus ``lowbit_state.*``. Loading a
state_dict without them (a plain checkpoint) works even with ``strict=True``: a load post-hook
drops the missing ``lowbit_state`` keys from the report and the recipe state keeps its current
(fresh) values. The other direction, a converted checkpoint into a plain model, is
``plain.load_state_dict(lowbit.plain_state_dict(sd))`` (or ``strict=False``, which reports the
recipe keys as unexpected and ignores them).

Delayed scaling starts from ``scale = 1`` (empty history), as TransformerEngine does: the first
step of a fresh layer quantizes with it, later steps with the history.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..scaling.recipes import Delayed, Recipe
from .functional import linear
from .spec import backend_problem, dtype_problem, shape_problem
from .state import LinearState

__all__ = ["Linear", "TransposedLinear", "STATE_NAME", "is_state_key", "LowbitModule"]

STATE_NAME = "lowbit_state"


def is_state_key(key: str) -> bool:
    """Whether a state_dict key belongs to a lowbit layer's recipe state."""
    return key.startswith(STATE_NAME + ".") or f".{STATE_NAME}." in key


def _drop_missing_state(module, incompatible) -> None:
    incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if not is_state_key(k)]


class LowbitModule:
    """Mixin: recipe, backend and state of a low-precision layer."""

    def _setup(self, recipe: Recipe, backend: str, seed: int, in_features: int, out_features: int):
        if not isinstance(recipe, Recipe):
            raise TypeError(f"recipe must be a lowbit recipe, got {recipe!r}")
        for why in (shape_problem(recipe, in_features, out_features), dtype_problem(self.weight)):
            if why:
                raise ValueError(f"{type(self).__name__} cannot take this layer: {why}")
        dev = self.weight.device
        why = backend_problem(backend, dev.type)
        if why and backend == "auto":
            raise ValueError(f"{type(self).__name__}: {why}")
        self.backend = backend  # an explicit backend that can't serve the device falls back to "auto"
        self.lowbit_state = LinearState(recipe, seed, device=dev)
        self.register_load_state_dict_post_hook(_drop_missing_state)

    @property
    def recipe(self) -> Recipe:
        return self.lowbit_state.recipe

    def reset_recipe_state(self) -> None:
        self.lowbit_state.reset()

    def _float_module(self) -> nn.Module:
        cls, attrs = self._orig
        m = cls.__new__(cls)
        nn.Module.__init__(m)
        m.__dict__.update(attrs)
        m.weight = self.weight
        m.register_parameter("bias", self.bias)
        m.train(self.training)
        return m


def _plain_attrs(module: nn.Module) -> dict:
    return {k: v for k, v in module.__dict__.items() if not k.startswith("_") and k != "training"}


class Linear(LowbitModule, nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 recipe: Optional[Recipe] = None, backend: str = "auto", seed: int = 0):
        nn.Linear.__init__(self, in_features, out_features, bias, device, dtype)
        self._orig = (nn.Linear, _plain_attrs(self))
        self._setup(recipe if recipe is not None else Delayed(), backend, seed, in_features, out_features)

    @classmethod
    def from_float(cls, mod: nn.Linear, recipe: Optional[Recipe] = None, backend: str = "auto",
                   seed: int = 0) -> "Linear":
        if not isinstance(mod, nn.Linear):
            raise TypeError(f"Linear.from_float takes an nn.Linear, got {type(mod).__name__}")
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = mod.in_features, mod.out_features
        new.weight = mod.weight
        new.register_parameter("bias", mod.bias)
        new.train(mod.training)
        new._orig = (type(mod), _plain_attrs(mod))
        new._setup(recipe if recipe is not None else Delayed(), backend, seed, mod.in_features, mod.out_features)
        return new

    def to_float(self) -> nn.Module:
        return self._float_module()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.lowbit_state, self.backend)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, backend={self.backend!r}"


def is_hf_conv1d(mod: nn.Module) -> bool:
    """Hugging Face ``transformers.pytorch_utils.Conv1D``: weight (in, out), ``y = x W + b``."""
    t = type(mod)
    return (t.__name__ == "Conv1D" and t.__module__.startswith("transformers")
            and isinstance(getattr(mod, "weight", None), torch.Tensor) and mod.weight.dim() == 2)


class TransposedLinear(LowbitModule, nn.Module):
    def __init__(self, mod: nn.Module, recipe: Optional[Recipe] = None, backend: str = "auto", seed: int = 0):
        """Wrap a Conv1D-style module (weight ``(in, out)``), sharing its parameters."""
        super().__init__()
        self.in_features, self.out_features = mod.weight.shape
        self.weight = mod.weight
        self.register_parameter("bias", mod.bias)
        self.train(mod.training)
        self._orig = (type(mod), _plain_attrs(mod))
        self._setup(recipe if recipe is not None else Delayed(), backend, seed, self.in_features, self.out_features)

    from_float = classmethod(lambda cls, mod, recipe=None, backend="auto", seed=0: cls(mod, recipe, backend, seed))

    def to_float(self) -> nn.Module:
        return self._float_module()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight.t(), self.bias, self.lowbit_state, self.backend)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, backend={self.backend!r}")

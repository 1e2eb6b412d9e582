"""``lowbit.convert(model, fmt)``: swap Linear layers for low-precision training ones, in place.

Format names and the recipes they stand for (``recipe=`` overrides):

=============  ==========================================================================
``fp8``        ``Delayed()``: tensorwise, amax history of 16, HYBRID (E4M3 fwd, E5M2 grads)
``fp8-current`` ``Current()``: tensorwise scale from each tensor's own amax, HYBRID
``fp8-rowwise`` ``Rowwise()``: one scale per row along K, HYBRID
``fp8-block``  ``Blockwise()``: 1x128 activation/gradient tiles, 128x128 weight blocks, E4M3 for
               every role (DeepSeek-V3, TransformerEngine's ``Float8BlockScaling``)
``mxfp8``      ``MX(elem="e4m3", scale_rule="rceil")``: 32-blocks, E8M0 scales rounded up (no
               block saturates; the MXFP8 pretraining rule), E4M3 for every role
``mxfp4``      ``MX(elem="e2m1")``: 32-blocks of E2M1, OCP floor scales, RNE everywhere
``nvfp4``      ``NV()``: 16-blocks of E2M1, UE4M3 x FP32 scales, 16x16 weight blocks, stochastic
               rounding of gradients, 16x16 random Hadamard transform on the wgrad operands
=============  ==========================================================================

What is converted: ``nn.Linear`` (and subclasses that keep ``nn.Linear.forward``) and Hugging
Face's ``Conv1D`` (GPT-2), each sharing its Parameter objects with the new layer (so optimizers,
tied weights elsewhere and meta-device models are untouched; no data is read).

What is skipped, with one warning listing every skipped layer and why:

* by the default filter (``filter=None``): the output head, i.e. every layer whose own name
  (last dotted component) is one of ``HEAD_NAMES`` (``lm_head``, ``head``, ``classifier``,
  ``output``, ``score``) and the last Linear of the model in registration order. A user
  ``filter(name, module) -> bool`` replaces this rule (True converts);
* always: shapes the format can't take (``lowbit.nn.spec.shape_problem``), non-float or float64
  parameters, a weight shared with another module (tied), ``nn.MultiheadAttention``'s
  ``out_proj`` (its weight is read directly, the module's forward never runs), layers already
  converted with another recipe (an error: ``unconvert`` first), and layers on a device no
  backend serves.

Backends: ``backend`` names the GEMM backend ("auto", "torch", "triton" once registered). A named
backend that cannot serve a layer's device falls back to "auto" (which ends at the exact "torch"
emulation) with one warning: the documented fallback. Converting twice with the same recipe is
idempotent; ``unconvert(model)`` puts the original classes back with the same parameters.
"""
from __future__ import annotations

import warnings
from typing import Callable, Dict, List, Optional, Tuple

from torch import nn

from .nn.linear import Linear, LowbitModule, TransposedLinear, is_hf_conv1d, is_state_key
from .nn.spec import backend_problem, dtype_problem, shape_problem
from .scaling.recipes import MX, NV, Blockwise, Current, Delayed, Recipe, Rowwise

__all__ = ["convert", "unconvert", "plain_state_dict", "FORMATS", "HEAD_NAMES", "recipe_for"]

FORMATS: Dict[str, Callable[[], Recipe]] = {
    "fp8": lambda: Delayed(),
    "fp8-current": lambda: Current(),
    "fp8-rowwise": lambda: Rowwise(),
    "fp8-block": lambda: Blockwise(),
    "mxfp8": lambda: MX(elem="e4m3", scale_rule="rceil"),
    "mxfp4": lambda: MX(elem="e2m1"),
    "nvfp4": lambda: NV(),
}
HEAD_NAMES = ("lm_head", "head", "classifier", "output", "score")


def recipe_for(fmt: str) -> Recipe:
    """The recipe a format name stands for (table above)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {sorted(FORMATS)} or pass recipe=")
    return FORMATS[fmt]()


def _kind(mod: nn.Module) -> Optional[str]:
    """'linear', 'conv1d', 'lowbit' or None (not a layer convert handles)."""
    if isinstance(mod, LowbitModule):
        return "lowbit"
    if isinstance(mod, nn.Linear):
        return "linear"
    if is_hf_conv1d(mod):
        return "conv1d"
    return None


def _dims(mod: nn.Module) -> Tuple[int, int]:
    if is_hf_conv1d(mod):
        return tuple(mod.weight.shape)
    return mod.in_features, mod.out_features


def _structural_problem(mod: nn.Module, kind: str, shared: set, mha_out: set) -> Optional[str]:
    if kind == "linear" and type(mod).forward is not nn.Linear.forward:
        return f"{type(mod).__name__} overrides nn.Linear.forward"
    if id(mod) in mha_out:
        return "nn.MultiheadAttention reads this weight directly (its forward never runs)"
    if id(mod.weight) in shared:
        return "weight is shared with another module (tied)"
    if kind == "linear" and (list(mod.children()) or list(mod.buffers(recurse=False))):
        return f"{type(mod).__name__} carries extra submodules or buffers"
    return dtype_problem(mod.weight)


def _plan(model: nn.Module, recipe: Recipe, filter, backend: str):
    """(to convert: [(name, module, kind)], skipped: [(name, why)])."""
    counts: Dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    shared = {i for i, c in counts.items() if c > 1}
    mha_out = {id(m.out_proj) for m in model.modules() if isinstance(m, nn.MultiheadAttention)}
    layers = [(n, m, k) for n, m in model.named_modules() for k in [_kind(m)] if k]
    last = layers[-1][0] if layers else None
    todo, skipped = [], []
    for name, mod, kind in layers:
        if kind == "lowbit":
            if mod.recipe != recipe:
                raise ValueError(f"{name or type(mod).__name__} is already converted with {mod.recipe!r}; "
                                 f"call lowbit.unconvert(model) before converting to {recipe!r}")
            continue
        why = _structural_problem(mod, kind, shared, mha_out) or shape_problem(recipe, *_dims(mod))
        if why is None and backend_problem(backend, mod.weight.device.type) and \
                backend_problem("auto", mod.weight.device.type):
            why = backend_problem("auto", mod.weight.device.type)
        if why is None:
            if filter is not None:
                why = None if filter(name, mod) else "excluded by filter"
            elif name.rsplit(".", 1)[-1] in HEAD_NAMES or name == last:
                why = "output head (default filter: named " + "/".join(HEAD_NAMES) + " or the last Linear)"
        if why:
            skipped.append((name, why))
        else:
            todo.append((name, mod, kind))
    return todo, skipped, layers


def _set(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def convert(model: nn.Module, fmt: str = "fp8", recipe: Optional[Recipe] = None,
            filter: Optional[Callable[[str, nn.Module], bool]] = None, backend: str = "auto") -> nn.Module:
    """Swap the model's Linear layers for ``lowbit.nn`` ones (in place) and return the model.

    A bare ``nn.Linear`` passed as ``model`` cannot be swapped in place: use the returned module.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert takes an nn.Module, got {type(model).__name__}")
    recipe = recipe if recipe is not None else recipe_for(fmt)
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a lowbit recipe (lowbit.recipes.*), got {recipe!r}")
    if backend != "auto":
        from .kernels.registry import BACKENDS
        BACKENDS.get(backend)  # unknown name -> ValueError listing the registered ones
    todo, skipped, layers = _plan(model, recipe, filter, backend)
    fell_back: List[str] = []
    out = model
    for i, (name, mod, kind) in enumerate(todo):
        be = backend
        if backend != "auto" and backend_problem(backend, mod.weight.device.type):
            be = "auto"
            fell_back.append(name or type(mod).__name__)
        cls = TransposedLinear if kind == "conv1d" else Linear
        new = cls.from_float(mod, recipe, be, seed=i)
        if name:
            _set(model, name, new)
        else:
            out = new
    if not layers:
        warnings.warn(f"lowbit.convert: {type(model).__name__} has no Linear layers; nothing converted",
                      stacklevel=2)
    elif skipped:
        lines = "\n".join(f"  {n or '<root>'}: {why}" for n, why in skipped)
        warnings.warn(f"lowbit.convert({recipe!r}): kept {len(skipped)} layer(s) in high precision:\n{lines}",
                      stacklevel=2)
    if fell_back:
        warnings.warn(f"lowbit.convert: backend {backend!r} cannot serve the device of {', '.join(fell_back)}; "
                      "those layers use backend='auto' (ends at the exact 'torch' emulation)", stacklevel=2)
    return out


def unconvert(model: nn.Module) -> nn.Module:
    """Put the original module classes back (same Parameter objects), in place; returns the model."""
    if isinstance(model, LowbitModule):
        return model.to_float()
    for name, mod in list(model.named_modules()):
        if name and isinstance(mod, LowbitModule):
            _set(model, name, mod.to_float())
    return model


def plain_state_dict(state_dict: dict) -> dict:
    """A converted model's state_dict without the recipe state: loads into the plain model strictly."""
    return type(state_dict)((k, v) for k, v in state_dict.items() if not is_state_key(k))

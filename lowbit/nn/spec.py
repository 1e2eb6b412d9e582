"""What a low-precision Linear needs to know besides its tensors: the recipe as a string (so it can
cross a ``torch.library`` custom op), the shapes and dtypes a recipe can take, and the backend.

* ``encode(recipe)`` / ``decode(s)``: a recipe (frozen dataclass of strs, ints, bools and tuples)
  <-> ``"module.QualName{json fields}"``; ``decode`` is cached, so the round trip is paid once.
* ``shape_problem(recipe, in_features, out_features)``: None, or why the layer can't be converted.
  Every FP8/FP4 GEMM (cuBLAS ``_scaled_mm``, lowbit's Triton kernels) needs K and N multiples of
  16; block recipes whose blocks run along both GEMM dims (MX, NV: K in the forward, N in dgrad)
  need both dims multiples of the block. The token count M is free (FP4 pads it, see ``ops``).
* ``dtype_problem(weight)``: None for fp32/bf16/fp16 parameters, else the reason.
* ``effective_backend(name, device_type)``: ``name`` when it can serve the device, otherwise
  ``"auto"`` (which ends at the exact ``"torch"`` emulation): the documented fallback.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import json
from typing import Optional

import torch

from ..kernels.registry import BACKENDS
from ..scaling.recipes import MX, NV, Recipe

__all__ = ["encode", "decode", "shape_problem", "dtype_problem", "effective_backend", "backend_problem",
           "GEMM_ALIGN", "FLOAT_DTYPES"]

GEMM_ALIGN = 16
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def encode(recipe: Recipe) -> str:
    if not (isinstance(recipe, Recipe) and dataclasses.is_dataclass(recipe)):
        raise TypeError(f"recipe must be a lowbit recipe (lowbit.recipes.*), got {recipe!r}")
    cls = type(recipe)
    fields = {f.name: getattr(recipe, f.name) for f in dataclasses.fields(recipe)}
    return f"{cls.__module__}.{cls.__qualname__}{json.dumps(fields, sort_keys=True)}"


@functools.lru_cache(maxsize=None)
def decode(s: str) -> Recipe:
    head, _, body = s.partition("{")
    mod, _, name = head.rpartition(".")
    cls = getattr(importlib.import_module(mod), name)
    if not (isinstance(cls, type) and issubclass(cls, Recipe)):
        raise TypeError(f"{head} is not a lowbit recipe")
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in json.loads("{" + body).items()}
    return cls(**fields)


def _block_along_k(recipe: Recipe) -> Optional[int]:
    if isinstance(recipe, (MX, NV)):
        return recipe.block
    return None


def shape_problem(recipe: Recipe, in_features: int, out_features: int) -> Optional[str]:
    if in_features % GEMM_ALIGN or out_features % GEMM_ALIGN:
        return (f"in_features={in_features}, out_features={out_features}: FP8/FP4 GEMMs need both "
                f"to be multiples of {GEMM_ALIGN}")
    blk = _block_along_k(recipe)
    if blk and (in_features % blk or out_features % blk):
        return (f"in_features={in_features}, out_features={out_features}: {type(recipe).__name__} "
                f"blocks of {blk} run along K (forward) and N (dgrad), so both must be multiples of {blk}")
    return None


def dtype_problem(weight: torch.Tensor) -> Optional[str]:
    if not weight.dtype.is_floating_point:
        return f"parameters are {weight.dtype}, not floating point"
    if weight.dtype not in FLOAT_DTYPES:
        return f"parameters are {weight.dtype}; scaled GEMMs produce fp32/bf16/fp16 only"
    return None


def backend_problem(name: str, device_type: str) -> Optional[str]:
    """None if ``name`` (or, for "auto", some registered backend) serves ``device_type``."""
    if device_type == "meta":
        return None
    if name == "auto":
        if any(device_type in be.devices for be in BACKENDS.backends.values()):
            return None
        return f"no lowbit backend serves device {device_type!r} (registered: {BACKENDS.names()})"
    if not BACKENDS.serves(name, device_type):
        be = BACKENDS.get(name)
        return f"backend {name!r} serves {be.devices + tuple(be.named_devices())}, not {device_type!r}"
    return None


def effective_backend(name: str, device_type: str) -> str:
    return "auto" if name != "auto" and backend_problem(name, device_type) else name

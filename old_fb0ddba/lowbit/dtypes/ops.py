"""Layout ops of FP8Tensor and FP4Tensor (mm/addmm are registered by ``lowbit.kernels``).

* detach / alias / clone: same data and scales (clone copies them).
* t / transpose of the last two dims: swap metadata, never requantize. FP8: data view
  transposed, scale transposed, block ``(r, c) -> (c, r)``. FP4: flip the ``transposed`` flag.
* view / reshape / _unsafe_view: FP8 tensorwise: any view. FP8 blocks ``(1, c)``: any view that
  keeps the last dim (rows regroup freely). Other FP8 blocks and FP4: only views that keep the
  last two dims (leading dims may change). Anything else would split a scale block: error.
* _to_copy: moves data and scales (device); a float ``dtype`` changes the dtype reported and
  used by ``dequantize()``, the FP8/FP4 payload is untouched.
"""
from __future__ import annotations

import torch

from .fp4_tensor import FP4_OPS, FP4Tensor
from .fp8_tensor import FP8_OPS, FP8Tensor

aten = torch.ops.aten

__all__ = []


def _fp8_like(x: FP8Tensor, data=None, scale=None, block=None, dtype=None) -> FP8Tensor:
    return FP8Tensor(x._data if data is None else data, x._scale if scale is None else scale,
                     x._block if block is None else block, dtype or x._orig_dtype)


def _fp4_like(x: FP4Tensor, fn=lambda t: t, transposed=None, dtype=None) -> FP4Tensor:
    return FP4Tensor(fn(x._qdata), fn(x._scale), fn(x._global_scale), x._block, x._kind,
                     x._transposed if transposed is None else transposed, dtype or x._orig_dtype)


# ---- detach / alias / clone ---------------------------------------------------------------
@FP8_OPS.implements([aten.detach.default, aten.alias.default])
def _fp8_detach(func, types, args, kwargs):
    x = args[0]
    return _fp8_like(x, func(x._data), func(x._scale))


@FP8_OPS.implements(aten.clone.default)
def _fp8_clone(func, types, args, kwargs):
    x = args[0]
    return _fp8_like(x, x._data.clone(), x._scale.clone())


@FP4_OPS.implements([aten.detach.default, aten.alias.default])
def _fp4_detach(func, types, args, kwargs):
    return _fp4_like(args[0], func)


@FP4_OPS.implements(aten.clone.default)
def _fp4_clone(func, types, args, kwargs):
    return _fp4_like(args[0], torch.clone)


# ---- transpose ----------------------------------------------------------------------------
def _last_two(x, d0, d1) -> bool:
    n = x.dim()
    return {d0 % n, d1 % n} == {n - 2, n - 1}


@FP8_OPS.implements([aten.t.default, aten.transpose.int])
def _fp8_t(func, types, args, kwargs):
    x = args[0]
    d0, d1 = (args[1], args[2]) if func is aten.transpose.int else (-2, -1)
    if x.dim() < 2 or not _last_two(x, d0, d1):
        if x.dim() < 2:
            return x
        raise NotImplementedError("FP8Tensor: only the last two dims can be transposed")
    scale = x._scale if x._block.is_tensorwise else x._scale.transpose(-2, -1)
    return _fp8_like(x, x._data.transpose(-2, -1), scale, x._block.t())


@FP4_OPS.implements([aten.t.default, aten.transpose.int])
def _fp4_t(func, types, args, kwargs):
    x = args[0]
    d0, d1 = (args[1], args[2]) if func is aten.transpose.int else (-2, -1)
    if x.dim() != 2 or not _last_two(x, d0, d1):
        raise NotImplementedError("FP4Tensor: only 2-D tensors can be transposed")
    return _fp4_like(x, transposed=not x._transposed)


# ---- views --------------------------------------------------------------------------------
def _resolve(shape, numel):
    shape = list(shape)
    if -1 in shape:
        i = shape.index(-1)
        rest = 1
        for j, s in enumerate(shape):
            if j != i:
                rest *= s
        shape[i] = numel // rest if rest else 0
    return shape


@FP8_OPS.implements([aten.view.default, aten._unsafe_view.default, aten.reshape.default])
def _fp8_view(func, types, args, kwargs):
    x, shape = args[0], _resolve(args[1], args[0].numel())
    if x._block.is_tensorwise:
        return _fp8_like(x, x._data.reshape(shape))
    old = list(x.shape)
    keeps_last = len(shape) >= 1 and len(old) >= 1 and shape[-1] == old[-1]
    keeps_two = len(shape) >= 2 and len(old) >= 2 and shape[-2:] == old[-2:]
    if keeps_two or (keeps_last and x._block.rows == 1 and len(shape) >= 2):
        nb = x._scale.shape[-1]
        new_scale = x._scale.reshape(*shape[:-1], nb) if not keeps_two else \
            x._scale.reshape(*shape[:-2], *x._scale.shape[-2:])
        return _fp8_like(x, x._data.reshape(shape), new_scale)
    raise NotImplementedError(f"FP8Tensor view {tuple(old)} -> {tuple(shape)} would split a "
                              f"{x._block} scale block; dequantize first")


@FP4_OPS.implements([aten.view.default, aten._unsafe_view.default, aten.reshape.default])
def _fp4_view(func, types, args, kwargs):
    x, shape = args[0], _resolve(args[1], args[0].numel())
    old = list(x.shape)
    if x._transposed or len(shape) < 2 or shape[-2:] != old[-2:]:
        if list(shape) == old:
            return _fp4_like(x)
        raise NotImplementedError(f"FP4Tensor view {tuple(old)} -> {tuple(shape)} would split "
                                  "packed bytes or scale blocks; dequantize first")
    lead = shape[:-2]
    return FP4Tensor(x._qdata.reshape(*lead, *x._qdata.shape[-2:]),
                     x._scale.reshape(*lead, *x._scale.shape[-2:]), x._global_scale, x._block,
                     x._kind, False, x._orig_dtype)


# ---- device / dtype -----------------------------------------------------------------------
def _copy_kwargs(kwargs):
    dtype = kwargs.get("dtype")
    if dtype is not None and not dtype.is_floating_point:
        raise TypeError(f"cannot convert a low-precision tensor to {dtype}; dequantize first")
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError("to(float8): the payload is already FP8; use ._data or dequantize()")
    return kwargs.get("device"), dtype


@FP8_OPS.implements(aten._to_copy.default)
def _fp8_to(func, types, args, kwargs):
    x = args[0]
    device, dtype = _copy_kwargs(kwargs)
    return _fp8_like(x, x._data.to(device=device), x._scale.to(device=device), dtype=dtype)


@FP4_OPS.implements(aten._to_copy.default)
def _fp4_to(func, types, args, kwargs):
    x = args[0]
    device, dtype = _copy_kwargs(kwargs)
    return _fp4_like(args[0], lambda t: t.to(device=device), dtype=dtype)


@FP8_OPS.implements(aten.is_same_size.default)
@FP4_OPS.implements(aten.is_same_size.default)
def _same_size(func, types, args, kwargs):
    return list(args[0].shape) == list(args[1].shape)


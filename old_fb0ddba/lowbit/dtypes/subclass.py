"""Shared machinery of the FP8/FP4 wrapper subclasses: the ops table and dispatch.

An ``OpTable`` maps aten overloads to handlers, filled by the ``implements`` decorator (here for
the layout ops, by ``lowbit.kernels`` for mm/addmm). An op with no handler raises
NotImplementedError naming the op, never a silent upcast.
"""
from __future__ import annotations

from typing import Callable, Dict

import torch

__all__ = ["OpTable", "LowbitTensor"]


class OpTable:
    """Explicit registry ``aten op -> handler(func, types, args, kwargs)``."""

    def __init__(self, name: str):
        self.name = name
        self._ops: Dict[object, Callable] = {}

    def implements(self, funcs):
        funcs = funcs if isinstance(funcs, (list, tuple)) else [funcs]

        def deco(fn):
            for f in funcs:
                self._ops[f] = fn
            return fn
        return deco

    def get(self, func):
        return self._ops.get(func)

    def __contains__(self, func) -> bool:
        return func in self._ops


class LowbitTensor(torch.Tensor):
    """Base of FP8Tensor / FP4Tensor: a wrapper subclass whose dtype is the original
    high-precision dtype; ``__torch_function__`` is disabled so everything goes to dispatch."""

    OPS: OpTable

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        handler = cls.OPS.get(func)
        if handler is None:
            raise NotImplementedError(
                f"{cls.__name__} does not support {func}; call .dequantize() first "
                f"(supported: {', '.join(sorted(str(f) for f in cls.OPS._ops))})")
        return handler(func, types, args, kwargs or {})

    def dequantize(self, dtype=None) -> torch.Tensor:  # pragma: no cover - overridden
        raise NotImplementedError

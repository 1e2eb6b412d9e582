"""Run Triton kernels under the interpreter when ``TRITON_INTERPRET=1`` is set at *call* time.

``@triton.jit`` decides at decoration (import) time whether a kernel is compiled or interpreted.
lowbit reads the environment only when a kernel is launched: ``interpreting()`` is the switch, and
``runnable(kernel)`` returns what to launch: the kernel itself on a GPU, or an interpreted twin
(built once per kernel; its ``@triton.jit`` helpers are rebuilt the same way, in a copy of the
module globals, so nothing in the module changes). Autotuned kernels are unwrapped under the
interpreter: the launcher passes one explicit configuration instead of benchmarking many.
"""
from __future__ import annotations

import functools
import os
import types

__all__ = ["interpreting", "runnable", "unwrap"]


def interpreting() -> bool:
    """``TRITON_INTERPRET`` is set to a true value now."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "no", "off")


def unwrap(kernel):
    """The JIT (or interpreted) function behind an ``Autotuner`` / ``Heuristics`` wrapper."""
    while type(kernel).__name__ in ("Autotuner", "Heuristics"):
        kernel = kernel.fn
    return kernel


def runnable(kernel):
    """``kernel`` to launch now: as is when compiling, an interpreted twin when interpreting
    (autotuning wrappers are dropped then: pass the configuration's constexprs explicitly)."""
    if not interpreting():
        return kernel
    fn = unwrap(kernel)
    if type(fn).__name__ == "InterpretedFunction":
        return fn
    return _interpreted(fn)


@functools.lru_cache(maxsize=None)
def _interpreted(jit):
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    fn = jit.fn
    glb = dict(fn.__globals__)
    twin = types.FunctionType(fn.__code__, glb, fn.__name__, fn.__defaults__, fn.__closure__)
    twin.__module__, twin.__qualname__ = fn.__module__, fn.__qualname__
    twin.__annotations__ = dict(getattr(fn, "__annotations__", {}))
    twin.__kwdefaults__ = fn.__kwdefaults__
    for name in fn.__code__.co_names:
        val = glb.get(name)
        if isinstance(val, JITFunction):
            glb[name] = _interpreted(val)
    return InterpretedFunction(twin)

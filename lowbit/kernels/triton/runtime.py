"""What the Triton launchers need to know about the machine, read at call time, never at import.

* The interpreter switch: ``@triton.jit`` decides at decoration (import) time whether a kernel is
  compiled or interpreted; lowbit reads ``TRITON_INTERPRET`` only when a kernel is launched.
  ``interpreting()`` is the switch, and ``runnable(kernel)`` returns what to launch: the kernel
  itself on a GPU, or an interpreted twin (built once per kernel; its ``@triton.jit`` helpers are
  rebuilt the same way, in a copy of the module globals, so nothing in the module changes).
  Autotuned kernels are unwrapped under the interpreter: the launcher passes one explicit
  configuration instead of benchmarking many.
* Device facts: compute capability and SM count of a CUDA device, read from the driver once per
  device (``torch.cuda.get_device_properties`` costs microseconds a call).
* Launch arithmetic: ``cdiv`` and ``next_pow2``, the formulas of ``triton.cdiv`` and
  ``triton.next_power_of_2`` in plain Python (theirs are ``constexpr_function`` wrappers, a few
  microseconds a call).
"""
from __future__ import annotations

import functools
import os
import types

import torch

__all__ = ["interpreting", "runnable", "unwrap", "gpu", "capability", "sm_count", "cdiv", "next_pow2"]


# ---- the interpreter switch ------------------------------------------------------------------
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


# ---- device facts ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def gpu(index: int) -> tuple:
    """((major, minor), SM count) of CUDA device ``index``."""
    props = torch.cuda.get_device_properties(index)
    return (props.major, props.minor), props.multi_processor_count


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def capability(device: torch.device) -> tuple:
    """(major, minor) of a CUDA ``device``."""
    return gpu(_index(device))[0]


def sm_count(device: torch.device) -> int:
    """SMs of a CUDA ``device``."""
    return gpu(_index(device))[1]


# ---- launch arithmetic ----------------------------------------------------------------------
def cdiv(x: int, y: int) -> int:
    """ceil(x / y) for y > 0: ``(x + y - 1) // y``, as triton.cdiv."""
    return (x + y - 1) // y


def next_pow2(n: int) -> int:
    """The smallest power of two >= n for n >= 1 (0 for n = 0), as triton.next_power_of_2."""
    return 1 << (n - 1).bit_length() if n > 0 else 0

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
* ``Launch``: one kernel launch of a plan (grid, constexprs and options fixed when the plan is
  made), called with the runtime arguments only. Its first call goes through the JIT (compiling
  and specialising as usual) and keeps the compiled kernel the JIT returns; later calls hand the
  arguments straight to that kernel's launcher, as the JIT's own last step does (``run(grid,
  stream, function, metadata, hooks, *args)``), skipping the per-call binding, specialisation key
  and cache lookup. That is valid while every argument specialises as on the first call: the
  plans that own launches are keyed by shape, strides, dtypes and 16-byte alignment of their
  inputs, and allocate their own outputs (aligned), so it holds by construction. Triton's launch
  hooks, when any is registered, get the JIT path. Under the interpreter every call is the JIT's.
* ``store_dtype`` (what a GEMM writes under the interpreter) and ``autotune_choices`` (the
  configurations autotuners chose, for benchmark reports).
"""
from __future__ import annotations

import functools
import os
import types

import torch

__all__ = ["interpreting", "runnable", "unwrap", "gpu", "capability", "sm_count", "cdiv", "next_pow2", "Launch",
           "store_dtype", "autotune_choices"]


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


def store_dtype(out_dtype: torch.dtype) -> torch.dtype:
    """What the GEMM kernels write: ``out_dtype``, or fp32 under the interpreter, whose fp32 -> bf16
    cast truncates; torch then rounds that fp32 result to nearest even, as the GPU does."""
    return torch.float32 if interpreting() else out_dtype


def autotune_choices(tuners: dict) -> dict:
    """``{"<name>(<tuning key>)": config}`` for every call the named autotuners have tuned."""
    return {f"{name}{tuple(key)}": str(cfg) for name, tuner in tuners.items()
            for key, cfg in getattr(tuner, "cache", {}).items()}


# ---- launches of a plan -----------------------------------------------------------------------
def _hooks():
    """(enter, exit) launch hooks of triton, or (None, None) when none is registered."""
    from triton import knobs
    enter, exit_ = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    if (enter is None or not getattr(enter, "calls", True)) and (exit_ is None or not getattr(exit_, "calls", True)):
        return None, None
    return enter, exit_


class Launch:
    """``kernel[grid](*args, **consts)`` for fixed ``grid`` and ``consts`` (constexprs and launch
    options), ``args`` the kernel's leading runtime parameters (module docstring: the first call
    is the JIT's, later ones go to the compiled kernel's launcher). ``kernel``: a JIT function,
    or an autotuner (its first call tunes; later calls launch the configuration it chose);
    ``grid``: a tuple, or a function of the meta-parameters (fixed once the configuration is)."""

    __slots__ = ("kernel", "grid", "consts", "_fast", "_tail", "_stream", "_device")

    def __init__(self, kernel, grid, **consts):
        self.kernel, self.grid, self.consts = kernel, grid if callable(grid) else tuple(grid), consts
        self._fast = None

    def __call__(self, *args):
        fast = self._fast
        if fast is not None:
            run, function, metadata = fast
            hooks = _hooks()
            if hooks[0] is None:
                g = self.grid
                return run(g[0], g[1] if len(g) > 1 else 1, g[2] if len(g) > 2 else 1, self._stream(self._device),
                           function, metadata, None, None, None, *args, *self._tail)
        return self._jit(args)

    def _jit(self, args):
        kernel = runnable(self.kernel)
        if interpreting() or self._fast is not None:
            return kernel[self.grid](*args, **self.consts)
        if type(kernel).__name__ == "Autotuner":
            kernel[self.grid](*args, **self.consts)  # tunes on first sight of its key, then launches
            if kernel.best_config.pre_hook is None:  # (a pre-hook edits arguments per launch: JIT path)
                self._adopt(kernel, args, {**self.consts, **kernel.best_config.all_kwargs()}, launched=True)
            return None
        self._adopt(kernel, args, self.consts, launched=False)
        return None

    def _adopt(self, kernel, args, consts: dict, launched: bool) -> None:
        """Launch through the JIT unless ``launched``; keep the compiled kernel's launcher when every
        parameter after the runtime ones is a constexpr given in ``consts`` (heuristics applied)
        or defaulted: their values are then the launcher's fixed tail."""
        jit = kernel
        while type(jit).__name__ in ("Autotuner", "Heuristics"):
            if type(jit).__name__ == "Heuristics":
                named = {**dict(zip(jit.arg_names, args)), **consts}
                consts = {**consts, **{v: h(named) for v, h in jit.values.items()}}
            jit = jit.fn
        if not launched:
            compiled = jit.run(*args, grid=self.grid, warmup=False, **consts)
        try:
            if launched:  # compiled by the autotuner already: the JIT's cache returns it
                compiled = jit.run(*args, grid=self.grid, warmup=True, **consts)
            if hasattr(compiled, "result"):
                compiled = compiled.result()
            tail = []
            for p in jit.params[len(args):]:
                if not p.is_constexpr or not (p.name in consts or p.has_default):
                    return
                tail.append(consts[p.name] if p.name in consts else p.default)
            from triton.runtime.driver import driver
            if callable(self.grid):  # a grid of the configuration's meta-parameters: fixed from now on
                self.grid = tuple(self.grid({**dict(zip(jit.arg_names, args)), **consts}))
            self._tail = tuple(tail)
            self._device = driver.active.get_current_device()
            self._stream = driver.active.get_current_stream
            self._fast = (compiled.run, compiled.function, compiled.packed_metadata)
        except Exception:  # noqa: BLE001 - any surprise in triton's internals: keep the JIT path
            self._fast = None

"""Compile with ``triton.language`` as Triton defines it, even under ``TRITON_INTERPRET=1``.

Under ``TRITON_INTERPRET=1`` the interpreter patches ``triton.language`` (builtins such as
``tl.tensor.__mul__``, ``tl.range``, ``tl.dtype.to_ir``...) while a kernel runs. A kernel run
restores them, but a call into an interpreted ``@triton.jit`` helper (``tl.sum``, ``tl.max``: the
standard library is interpreted too) patches without restoring (triton 3.6 and 3.9), so after the
first interpreted reduction every later ``triton.compile`` in the process fails inside code
generation. lowbit's CPU tests run interpreted kernels *and* compile for sm_90, so:
``SNAPSHOT`` records the language objects when this module is imported (before any kernel has
run, in pytest's collection and in the CLI), and ``pristine_language()`` puts those objects back for
the duration of a compile, then returns the interpreter's versions where it found them.

Second, when triton itself was imported with ``TRITON_INTERPRET=1`` (lowbit's CI), its standard
library (``tl.sum``, ``tl.max``, ``tensor.sum``...) consists of ``InterpretedFunction`` objects, which
code generation would *call* as Python (patching the language as it goes). For the compile they are
swapped for ``JITFunction`` rebuilds of the same Python functions (``compile.as_jit_function``).
"""
from __future__ import annotations

import contextlib

__all__ = ["pristine_language", "interpreter_patched"]


def _owners():
    import triton.language as tl
    core = tl.core
    owners = [tl, core, tl.math, core.tensor, core.dtype, getattr(core, "condition", None),
              getattr(core, "tensor_descriptor_base", None)]
    return [o for o in owners if o is not None]


def _is_interp(v) -> bool:
    """An object the interpreter installs (its lambdas/functions, partials of them, or ``print``)."""
    if v is print:
        return True
    for cand in (v, getattr(v, "func", None), getattr(v, "fget", None)):
        code = getattr(cand, "__code__", None)
        if code is not None and code.co_filename.replace("\\", "/").endswith("triton/runtime/interpreter.py"):
            return True
    return False


def _state() -> dict:
    return {(id(o), name): (o, name, val) for o in _owners() for name, val in list(vars(o).items())}


def interpreter_patched() -> bool:
    """True when ``triton.language`` currently holds interpreter patches."""
    return any(_is_interp(val) for _, _, val in _state().values())


SNAPSHOT = None if interpreter_patched() else _state()


def _interpreted_attrs(extra_modules=()) -> list[tuple[object, str, object]]:
    """(owner, name, InterpretedFunction) in triton.language's modules, the tensor class, and
    ``extra_modules`` (the modules a kernel refers to, e.g. inductor's ``triton_helpers``)."""
    import sys

    import triton.language as tl
    owners = [m for n, m in list(sys.modules.items()) if m is not None and (n == "triton.language" or
                                                                          n.startswith("triton.language."))]
    owners.append(tl.core.tensor)
    owners += [m for m in extra_modules if m not in owners]
    out = []
    for o in owners:
        for name, val in list(vars(o).items()):
            if type(val).__name__ == "InterpretedFunction":
                out.append((o, name, val))
    return out


@contextlib.contextmanager
def pristine_language(extra_modules=()):
    """Compile-time ``triton.language``: snapshot objects back, interpreted stdlib functions as JIT."""
    from .compile import as_jit_function
    swapped = _interpreted_attrs(extra_modules)
    for owner, name, val in swapped:
        setattr(owner, name, as_jit_function(val))
    try:
        with _unpatched():
            yield
    finally:
        for owner, name, val in swapped:
            setattr(owner, name, val)


@contextlib.contextmanager
def _unpatched():
    """Restore the snapshot's language objects while the body runs (a no-op when nothing differs)."""
    now = _state()
    changed = {k: v for k, v in now.items() if _is_interp(v[2])}
    if not changed:
        yield
        return
    if SNAPSHOT is None:
        raise RuntimeError("triton.language was left patched by the Triton interpreter before lowbit.fma_guard "
                           "was imported (an interpreted @triton.jit helper call does not restore it); import "
                           "lowbit.fma_guard before running interpreted kernels, or scan in a fresh process")
    try:
        for key, (owner, name, _) in changed.items():
            if key in SNAPSHOT:
                setattr(owner, name, SNAPSHOT[key][2])
            else:
                delattr(owner, name)  # the patch shadowed an inherited member
        yield
    finally:
        for owner, name, val in changed.values():
            setattr(owner, name, val)

"""``guard(kernel)``: launch a Triton kernel with FP contraction off.

Every launch ``guarded[grid](...)`` passes ``enable_fp_fusion=False``: LLVM then emits ``mul.rn`` /
``add.rn`` (explicit rounding, which ptxas may not fuse) and ptxas runs with ``--fmad=false``, so
every product is rounded exactly once, the same way at every use. It is a compile option, so the
guarded kernel is a separate JIT specialisation; autotuned kernels pass it through to each config.

Triton has no per-expression contraction switch. To unfuse only the hazardous expression, round
the product explicitly in the kernel (``libdevice.mul_rn(x, s)``: ``mul.rn`` is never contracted)
or use one of the fixes the scan prints; ``GuardedKernel.scan`` judges the result.

The cost (a few percent on exp-bound kernels: each fma becomes a mul and an add) is measured on
the GPU by ``benchmarks/fma_guard_gpu.py``.
"""
from __future__ import annotations

import functools

__all__ = ["guard", "GuardedKernel"]


class GuardedKernel:
    """A kernel whose launches always compile with ``enable_fp_fusion=False``."""

    def __init__(self, kernel):
        if not hasattr(kernel, "__getitem__") and not hasattr(kernel, "run"):
            raise TypeError(f"guard: {kernel!r} is not a Triton kernel")
        self.kernel = kernel
        functools.update_wrapper(self, getattr(kernel, "fn", kernel), updated=())

    @property
    def fn(self):
        return self.kernel

    def __getitem__(self, grid):
        return functools.partial(self.run, grid=grid)

    def run(self, *args, grid, **kwargs):
        if kwargs.get("enable_fp_fusion", False):
            raise ValueError("guard: this kernel is guarded; enable_fp_fusion=True is not allowed")
        kwargs["enable_fp_fusion"] = False
        return self.kernel[grid](*args, **kwargs)

    def __call__(self, *args, **kwargs):
        raise TypeError("a guarded kernel is launched as kernel[grid](...), not called")

    def scan(self, signature_or_example_args, constexprs=None, **kwargs):
        """``scan`` of the kernel as the guard compiles it (fusion off)."""
        from .scan import scan
        if kwargs.pop("enable_fp_fusion", False):
            raise ValueError("guard: a guarded kernel is scanned with enable_fp_fusion=False")
        return scan(self.kernel, signature_or_example_args, constexprs, enable_fp_fusion=False, **kwargs)

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def __repr__(self):
        return f"guard({self.kernel!r})"


def guard(kernel) -> GuardedKernel:
    """Decorator / wrapper: ``guard(kernel)[grid](...)`` launches with ``enable_fp_fusion=False``.

    Use above ``@triton.jit`` (and above ``@triton.autotune`` if present)."""
    if isinstance(kernel, GuardedKernel):
        return kernel
    return GuardedKernel(kernel)

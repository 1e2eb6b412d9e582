"""The Gluon kernels lowbit ships (its production Hopper GEMMs), compiled and scanned like the Triton ones.

A ``@gluon.jit`` kernel takes tensor descriptors and layouts that a plain signature string cannot
describe, so each is compiled by its module's own helper (``compile_ws_for_sm90``, which
builds the descriptor types), under the scan's conditions: PTX only (no ptxas) and, under
``TRITON_INTERPRET=1``, with ``triton.language`` as Triton defines it (``pristine_language``).
``GLUON_SPECS`` is the one table of what to compile: per kernel the modes whose promotion
arithmetic differs (tensorwise: ``acc += T``; blockwise: ``fma(T, s, acc)``; blockwise_cols:
``fma(T, RN(sA sB), acc)``; rowwise differs from tensorwise only in the epilogue's scale vectors).
A Gluon kernel of ``lowbit.kernels`` that no entry covers is reported as missing, like a Triton
kernel without ``SCAN_SPECS``; an entry that cannot compile here (a triton without Gluon, a target
other than sm_90) is counted and named as not scanned.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import types

from .scan import Report, scan_ptx

__all__ = ["GluonSpec", "GLUON_SPECS", "scan_gluon", "gluon_unavailable"]


@dataclasses.dataclass(frozen=True)
class GluonSpec:
    module: str
    kernel: str          # attribute name of the @gluon.jit kernel in ``module``
    helper: str          # ``module.helper(**kwargs)`` -> triton CompiledKernel for sm_90a
    kwargs: tuple = ()   # (name, value) pairs

    @property
    def label(self) -> str:
        mode = dict(self.kwargs).get("mode")
        return f"{self.kernel}[{mode}]" if mode else self.kernel


GLUON_SPECS = (
    GluonSpec("lowbit.kernels.triton.gemm_fp8.gluon_ws", "_fp8_gemm_ws_kernel", "compile_ws_for_sm90",
              (("mode", "tensorwise"), ("config", "ws_s3_g16_eo"))),
    GluonSpec("lowbit.kernels.triton.gemm_fp8.gluon_ws", "_fp8_gemm_ws_kernel", "compile_ws_for_sm90",
              (("mode", "blockwise_cols"), ("config", "ws_s3_ss"))),
)


def gluon_unavailable(spec: GluonSpec, target: str):
    """Why ``spec`` cannot be compiled here, or None."""
    from .compile import parse_target
    if parse_target(target).arch != 90:
        return f"Gluon kernels compile for sm_90a only (target {target})"
    if getattr(importlib.import_module(spec.module), spec.kernel, None) is None:
        return "this triton has no Gluon"
    return None


@functools.lru_cache(maxsize=None)
def scan_gluon(spec: GluonSpec, target: str = "sm_90") -> Report:
    """Compile ``spec`` (PTX only) and scan it; cached per process (a compile takes seconds)."""
    from .compile import _ptx_only, as_jit_function
    from .pristine import pristine_language
    mod = importlib.import_module(spec.module)
    modules = [v for v in vars(mod).values() if isinstance(v, types.ModuleType)]
    with pristine_language(as_jit_function, modules), _ptx_only():
        compiled = getattr(mod, spec.helper)(**dict(spec.kwargs))
    return scan_ptx(compiled.asm["ptx"], kernel=spec.label, llir=compiled.asm.get("llir", ""), target="sm_90a",
                    enable_fp_fusion=True)

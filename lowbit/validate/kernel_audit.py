"""``lowbit audit kernels``: every shipped kernel against the exact references.

``audit_kernels(quick=True, device=None, checks=None, progress=None) -> KernelAudit`` runs each
``KernelCheck`` of the registry (``CHECKS``; ``kernel_checks`` says how to add one) on the "triton"
backend (the Triton kernels: natively on a GPU, under ``TRITON_INTERPRET=1`` on the CPU) and the
"torch" emulation. ``KernelAudit.passed`` is True when every row passed; ``format()`` gives the
table (kernel, backend, format, shape, inputs, max ULP or bound ratio, pass/fail) and
``to_dict()`` the JSON of ``--json``.

``quick`` (what CI runs): the adversarial inputs (which hold random rows too), 8x256 casts,
16x48x256 GEMMs (K = 320 for blockwise: a partial chunk) and attention at 33 and 40 tokens.
Otherwise also random inputs, 256x1024 casts (the oracle on a sample, every element against the
torch reference), bf16 inputs, GEMMs of 128x128x1024 (the Gluon kernels' shapes on sm_90) and
16x32x16384, bf16 outputs, and attention at 77 and 128 tokens (1024 on a GPU).
"""
from __future__ import annotations

import dataclasses
import json

import torch

from . import check_attention, check_casts, check_gemm
from .kernel_checks import AuditConfig, CheckResult, KernelCheck

__all__ = ["CHECKS", "KernelAudit", "audit_kernels"]

CHECKS = (
    KernelCheck("casts", "quantize_fp8 / quantize_fp8_t / quantize_fp4 of every recipe, bit-exact", check_casts.run),
    KernelCheck("gemm", "scaled_mm of every format pair, error / analytic bound", check_gemm.run),
    KernelCheck("attention", "FP8 attention forward and backward, error / 1.25x the plain E4M3 error",
                check_attention.run),
)


@dataclasses.dataclass(frozen=True)
class KernelAudit:
    config: AuditConfig
    results: tuple

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def to_dict(self) -> dict:
        return {"device": self.config.device, "quick": self.config.quick, "backends": list(self.config.backends),
                "passed": self.passed, "results": [r.to_dict() for r in self.results]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def format(self) -> str:
        cols = ("kernel", "backend", "format", "shape", "inputs", "max ULP / bound ratio", "result")
        rows = [(r.kernel, r.backend, r.format, r.shape, r.inputs, _value(r), "pass" if r.passed else "FAIL")
                for r in self.results]
        widths = [max(len(c), *(len(x[i]) for x in rows)) if rows else len(c) for i, c in enumerate(cols)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(x, widths)) for x in rows]
        failed = [r for r in self.results if not r.passed]
        lines.append(f"\n{len(self.results)} checks on {self.config.device} ({'quick' if self.config.quick else 'full'}): "
                     f"{len(self.results) - len(failed)} passed, {len(failed)} failed")
        lines += [f"FAIL {r.kernel} [{r.backend}] {r.format} {r.shape} {r.inputs}: {r.detail}" for r in failed]
        return "\n".join(lines)


def _value(r: CheckResult) -> str:
    if r.metric == "max ULP":
        return f"{r.value:g} ULP"
    return f"ratio {r.value:.3g}"


def _backends(device: str) -> tuple:
    from ..kernels import BACKENDS
    return tuple(b for b in ("triton", "torch") if b in BACKENDS.names())


def audit_kernels(quick: bool = True, device=None, checks=None, progress=None, seed: int = 0) -> KernelAudit:
    """Run ``checks`` (default ``CHECKS``; module docstring). ``device``: "cuda" when a GPU is
    present, else "cpu"; ``progress(i, n, name)`` is called before each check."""
    checks = CHECKS if checks is None else tuple(checks)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    config = AuditConfig(device=str(device), quick=quick, backends=_backends(str(device)), seed=seed)
    results = []
    for i, check in enumerate(checks):
        if progress is not None:
            progress(i, len(checks), check.name)
        results.extend(check.run(config))
    if progress is not None:
        progress(len(checks), len(checks), "done")
    return KernelAudit(config, tuple(results))

"""What ``lowbit audit kernels`` runs: a registry of kernel checks and the rows they report.

A ``KernelCheck`` names what it audits and has ``run(config) -> iterable of CheckResult``; the
audit (``audit_kernels``) runs every check in ``CHECKS`` (``lowbit.validate.kernel_audit``) or the
ones it is given. A ``CheckResult`` is one row of the report: kernel, backend, format, shape,
inputs, the metric (``"max ULP"``: steps of the output format between the kernel's value and the
correctly rounded one, limit 0 for casts; ``"bound ratio"``: max error / analytic bound, limit 1),
its value, pass/fail and a detail line. A kernel that declines a call it should take, or raises,
is a failed row, never a skipped one.

To add a kernel family (attention, say): write ``check_<family>.py`` with a function
``run(config) -> list[CheckResult]`` comparing the kernel (through ``lowbit.kernels``' public
API) with ``lowbit.validate.references`` by ``metrics.ulp_error`` / ``bound_ratio``, and add
``KernelCheck("<family>", "<what>", check_<family>.run)`` to ``CHECKS``.
"""
from __future__ import annotations

import dataclasses
import math
import traceback
from typing import Callable, Iterable

__all__ = ["AuditConfig", "CheckResult", "KernelCheck", "failed_row"]


@dataclasses.dataclass(frozen=True)
class AuditConfig:
    """``device``: "cpu" (Triton kernels under the interpreter) or "cuda"; ``quick``: small shapes
    (what CI runs); ``backends``: which ``lowbit.kernels`` backends to audit; ``seed`` of the inputs."""
    device: str = "cpu"
    quick: bool = True
    backends: tuple = ("triton", "torch")
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class CheckResult:
    kernel: str
    backend: str
    format: str
    shape: str
    inputs: str
    metric: str
    value: float
    limit: float
    passed: bool
    detail: str = ""

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["value"] = _json_float(self.value)
        return d


@dataclasses.dataclass(frozen=True)
class KernelCheck:
    name: str
    description: str
    run: Callable[[AuditConfig], Iterable[CheckResult]]


def _json_float(v: float):
    return v if math.isfinite(v) else ("inf" if v > 0 else "-inf" if v < 0 else "nan")


def failed_row(kernel: str, backend: str, fmt: str, shape: str, inputs: str, metric: str, limit: float,
               err: BaseException) -> CheckResult:
    """The row of a kernel call that raised (the last traceback line as the detail)."""
    last = "".join(traceback.format_exception_only(type(err), err)).strip().splitlines()[-1:]
    return CheckResult(kernel, backend, fmt, shape, inputs, metric, math.inf, limit, False,
                       f"raised {' '.join(last)[:300]}")

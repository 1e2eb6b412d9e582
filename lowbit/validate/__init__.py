"""Exact references, error metrics and bounds, and the numerics audit. Nothing on the hot path imports this package.

* ``oracle``: correctly rounded casts, exact dot products; ``references``: correctly rounded exp,
  exp2, log, log2, softmax, logsumexp, attention (mpmath, any precision); ``metrics``: ULP error and
  histogram, relative Frobenius error, SQNR, exact GEMM error, error bounds (fp32 accumulation,
  tensor-core accumulation, quantization, underflow) and the error / bound ratio.
* ``audit_kernels()``: every shipped kernel against the references (``lowbit audit kernels``);
  checks are a registry (``CHECKS``, ``KernelCheck``; ``kernel_checks`` says how to add one).
* ``audit_model(model, batch, formats)``: per layer and format SQNR (worst channel too), saturation,
  dynamic range and a recommended format (``lowbit audit model``).
* ``audit_hardware()``: the GPU's tensor-core accumulator, measured (``lowbit audit hardware``).
"""
from .hardware import HardwareAudit, audit_hardware
from .kernel_audit import CHECKS, KernelAudit, audit_kernels
from .kernel_checks import AuditConfig, CheckResult, KernelCheck
from .model_audit import ModelAudit, audit_model

__all__ = ["audit_kernels", "audit_model", "audit_hardware", "KernelAudit", "ModelAudit", "HardwareAudit",
           "CHECKS", "KernelCheck", "CheckResult", "AuditConfig"]

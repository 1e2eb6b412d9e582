"""Error metrics and analytic bounds.

* ``gamma(n, u) = n u / (1 - n u)``: the classic bound on the relative error of n floating-point
  operations with unit roundoff ``u`` (Higham, Accuracy and Stability, ch. 3).
* A dot product of length K whose products are exact and summed in fp32 (any order) satisfies
  ``|fl(sum) - sum| <= gamma(K - 1, 2^-24) * sum |a_k b_k|``; applying per-chunk scales and summing
  n chunks adds at most ``n + 2`` more roundings: ``gemm_bound`` uses ``gamma(K + n + 2)``.
* ``bound_ratio = max |err| / bound``: <= 1 means inside the bound; reports give this number.
"""
from __future__ import annotations

import math

import mpmath
import torch

from .oracle import exact_dot

__all__ = ["gamma", "gemm_bound", "exact_matmul", "bound_ratio", "sqnr_db", "U_FP32", "U_BF16"]

U_FP32 = 2.0 ** -24
U_BF16 = 2.0 ** -8


def gamma(n: int, u: float = U_FP32) -> float:
    if n * u >= 1:
        raise ValueError(f"gamma({n}) undefined: n * u >= 1")
    return n * u / (1 - n * u)


def gemm_bound(a: torch.Tensor, b: torch.Tensor, n_chunks: int = 1, u: float = U_FP32) -> torch.Tensor:
    """Elementwise bound ``gamma(K + n_chunks + 2, u) * (|a| @ |b|)`` (float64) for a @ b."""
    K = a.shape[-1]
    absdot = a.abs().to(torch.float64) @ b.abs().to(torch.float64)
    return gamma(K + n_chunks + 2, u) * absdot


def exact_matmul(a: torch.Tensor, b: torch.Tensor) -> list:
    """Exact ``a @ b`` (mpmath mpf entries, row-major nested lists) of binary fp32/fp64 inputs."""
    A = a.to(torch.float64).tolist()
    Bt = b.to(torch.float64).t().tolist()
    return [[exact_dot(row, col) for col in Bt] for row in A]


def bound_ratio(out: torch.Tensor, exact: list, bound: torch.Tensor) -> float:
    """max_ij |out_ij - exact_ij| / bound_ij, each difference computed exactly then rounded."""
    worst = 0.0
    o = out.to(torch.float64).tolist()
    bd = bound.tolist()
    for i, row in enumerate(exact):
        for j, e in enumerate(row):
            if math.isnan(o[i][j]):
                return float("inf")
            err = abs(mpmath.mpf(o[i][j]) - e)
            if err:
                worst = max(worst, float(err) / bd[i][j] if bd[i][j] > 0 else float("inf"))
    return worst


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio ``10 log10(||ref||^2 / ||ref - approx||^2)`` in dB."""
    ref, approx = ref.to(torch.float64), approx.to(torch.float64)
    noise = (ref - approx).pow(2).sum().item()
    sig = ref.pow(2).sum().item()
    return float("inf") if noise == 0 else 10 * math.log10(sig / noise) if sig > 0 else -float("inf")

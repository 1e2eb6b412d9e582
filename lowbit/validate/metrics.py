"""Error metrics and analytic bounds.

Metrics (float64 results):

* ``ulp_distance(a, b, fmt)``: how many values of ``fmt`` lie between ``a`` and ``b`` (both in
  ``fmt``): 0 for equal values (``-0 == +0``, NaN == NaN), inf for NaN against a number.
* ``ulp_error(out, exact, fmt)``: ``|out - exact| / ulp(exact)`` with ``ulp(v) = 2^(max(floor(log2|v|),
  emin) - mbits)``; a correctly rounded result has ``<= 0.5``. ``ulp_histogram`` counts them.
* ``rel_frobenius(ref, approx) = ||ref - approx||_F / ||ref||_F``; ``sqnr_db(ref, approx) =
  10 log10(||ref||^2 / ||ref - approx||^2)``; ``sqnr_per_channel_db`` the same per slice.
* ``matmul_error(out, a, b)``: ``|out - a @ b|`` for operands held exactly in float64, from exact
  products (Dekker's TwoProduct) summed in doubled precision (Sum2), as an upper bound within
  2^-52 relative of the exact value (plus a ``(K 2^-52)^2 sum|a b|``-sized term).

Bounds on ``|C - C*|`` for ``C* = a @ b`` (elementwise, float64; ``S = |a| @ |b|``):

* ``gamma(n, u) = n u / (1 - n u)`` (Higham, Accuracy and Stability, ch. 3). Products exact and
  summed in fp32 round-to-nearest (any order): ``gamma(K - 1) S``; scaling and summing ``n`` chunks
  adds at most ``n + 2`` roundings: ``gemm_bound`` is ``gamma(K + n + 2) S``.
* A tensor core (``TensorCore``): exact products summed ``group`` at a time into a running sum that
  keeps ``bits`` significant bits by truncation, restarted from zero and promoted (added in fp32)
  every ``promote`` products. In a chain ``c`` of ``L`` products every product and the running sum
  at each group step lose less than one unit of the ``bits``-th bit of the chain's largest
  magnitude, itself ``<= S_c``, and a product never loses more than itself: ``sum_k min(|a_k b_k|,
  2^(1-bits) S_c) + ceil(L / group) 2^(1-bits) S_c``; the promotions and the per-chunk scalings
  add ``gamma(chains + n + 2) S`` (``tensor_core_bound``). ``HOPPER_FP8``: 14 bits, groups of 32
  (DeepSeek-V3: "around 14 bits"; SageAttention2: an FP22 accumulator, 13 mantissa bits) and
  ``HOPPER_BF16``: 23 bits (Fasi et al. 2021: products aligned and truncated at fp32's
  precision); ``lowbit audit hardware`` measures them.
* ``quantization_bound(x, scale, fmt)``: ``|scale * Q(x) - x|`` of the contract cast (fp32 division,
  rounding to ``fmt``, saturation): ``(u + 2^-23) |x| + scale * min_subnormal / 2 + max(0, |x| -
  fmax * scale)``, ``u = 2^-(mbits+1)`` (``2^-mbits`` and a whole subnormal step for stochastic
  rounding). ``quantized_matmul_bound`` adds the operands' error to an accumulation bound:
  ``|Qa Qb - a b| <= ea @ |b| + |a| @ eb + ea @ eb``.
* ``underflow_bound(n_ops, row_scale, col_scale, codes_dot)``: the relative bounds above hold down
  to fp32's normal range; below it every rounded product or scaling may lose up to ``2^-150``
  absolute, times what multiplies it later (the other scale, the codes' sum when a kernel forms
  ``sA sB`` first): ``n_ops 2^-150 (1 + sA_i)(1 + sB_j)(1 + C_ij)`` with ``sA_i``, ``sB_j`` the largest
  dequantization factors of row i and column j and ``C = |qA| @ |qB|`` over the unscaled codes.
* ``bound_ratio = max |err| / bound``: <= 1 means inside the bound; reports give this number.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import mpmath
import numpy as np
import torch

from ..dtypes.formats import FP16, BF16, FP32, Format, get_format
from .oracle import exact_dot

__all__ = ["gamma", "gemm_bound", "exact_matmul", "bound_ratio", "sqnr_db", "U_FP32", "U_BF16",
           "ulp_distance", "ulp_error", "ulp_histogram", "rel_frobenius", "sqnr_per_channel_db", "matmul_error",
           "TensorCore", "HOPPER_FP8", "HOPPER_BF16", "tensor_core_bound", "quantization_bound",
           "quantized_matmul_bound", "output_rounding_bound", "underflow_bound"]

U_FP32 = 2.0 ** -24
U_BF16 = 2.0 ** -8
_F64_SLACK = 1 + 2.0 ** -30  # covers the float64 rounding of the bounds' own matmuls (K < 2^22)


def gamma(n: int, u: float = U_FP32) -> float:
    if n * u >= 1:
        raise ValueError(f"gamma({n}) undefined: n * u >= 1")
    return n * u / (1 - n * u)


def gemm_bound(a: torch.Tensor, b: torch.Tensor, n_chunks: int = 1, u: float = U_FP32) -> torch.Tensor:
    """Elementwise bound ``gamma(K + n_chunks + 2, u) * (|a| @ |b|)`` (float64) for a @ b."""
    K = a.shape[-1]
    absdot = a.abs().to(torch.float64) @ b.abs().to(torch.float64)
    return gamma(K + n_chunks + 2, u) * absdot * _F64_SLACK


def exact_matmul(a: torch.Tensor, b: torch.Tensor) -> list:
    """Exact ``a @ b`` (mpmath mpf entries, row-major nested lists) of binary fp32/fp64 inputs."""
    A = a.to(torch.float64).tolist()
    Bt = b.to(torch.float64).t().tolist()
    return [[exact_dot(row, col) for col in Bt] for row in A]


def bound_ratio(out: torch.Tensor, exact, bound: torch.Tensor) -> float:
    """max_ij |out_ij - exact_ij| / bound_ij. ``exact``: nested lists of mpf (each difference
    computed exactly, then rounded), or the errors themselves as a tensor (``matmul_error``).
    A NaN error gives inf; a nonzero error against a zero bound gives inf."""
    if isinstance(exact, torch.Tensor):
        err = exact.to(torch.float64)
    else:
        o = out.to(torch.float64).tolist()
        err = torch.tensor([[math.nan if math.isnan(o[i][j]) else float(abs(mpmath.mpf(o[i][j]) - e))
                             for j, e in enumerate(row)] for i, row in enumerate(exact)], dtype=torch.float64)
    if bool(torch.isnan(err).any()):
        return math.inf
    bd = bound.to(torch.float64).expand_as(err)
    ratio = torch.where(err == 0, torch.zeros_like(err), err / bd)
    return float(ratio.max()) if ratio.numel() else 0.0


# ---- elementwise and norm metrics -----------------------------------------------------------------------
def _ordinal(x: torch.Tensor, fmt: Format) -> torch.Tensor:
    """Integer rank of each (non-NaN) value of ``fmt``: consecutive values differ by 1, -0 = +0."""
    if fmt in (FP32, BF16, FP16):
        bits = x.to(fmt.torch_dtype).view(torch.int32 if fmt is FP32 else torch.int16).to(torch.int64)
    else:
        bits = fmt.encode(torch.nan_to_num(x.to(torch.float64), nan=0.0)).to(torch.int64)
    if not fmt.signed:
        return bits
    nbits = 32 if fmt is FP32 else 16 if fmt in (BF16, FP16) else fmt.nbits
    mag = bits & ((1 << (nbits - 1)) - 1)
    return torch.where((bits >> (nbits - 1)) & 1 == 1, -mag, mag)


def ulp_distance(a: torch.Tensor, b: torch.Tensor, fmt) -> torch.Tensor:
    """Number of ``fmt`` steps between ``a`` and ``b`` (values of ``fmt``), float64."""
    fmt = get_format(fmt)
    a, b = torch.broadcast_tensors(a.to(torch.float64), b.to(torch.float64))
    d = (_ordinal(a, fmt) - _ordinal(b, fmt)).abs().to(torch.float64)
    na, nb = torch.isnan(a), torch.isnan(b)
    d = torch.where(na & nb, torch.zeros_like(d), d)
    return torch.where(na ^ nb, torch.full_like(d, math.inf), d)


def ulp_error(out: torch.Tensor, exact: torch.Tensor, fmt) -> torch.Tensor:
    """``|out - exact| / ulp_fmt(exact)`` (float64; ``exact``: float64 values of the exact result).
    Equal non-finite values give 0, other non-finite pairs inf."""
    fmt = get_format(fmt) if not isinstance(fmt, Format) else fmt
    o, e = torch.broadcast_tensors(out.to(torch.float64), exact.to(torch.float64))
    mag = e.abs()
    _, ex = torch.frexp(torch.where(mag > 0, mag, torch.ones_like(mag)))
    lg = torch.where(mag > 0, ex.to(torch.float64) - 1, torch.full_like(mag, fmt.emin))  # floor(log2|v|)
    step = torch.exp2(torch.clamp(lg, min=fmt.emin) - fmt.mbits)
    err = (o - e).abs() / step
    same = (o == e) | (torch.isnan(o) & torch.isnan(e))
    err = torch.where(same, torch.zeros_like(err), err)
    bad = ~same & ~(torch.isfinite(o) & torch.isfinite(e))
    return torch.where(bad, torch.full_like(err, math.inf), err)


def ulp_histogram(ulps: torch.Tensor, edges=(0, 0.5, 1, 2, 4, 8)) -> dict:
    """Counts of ULP errors per bin: ``"0"``, ``"(e_i, e_i+1]"`` ..., ``">e_last"``, ``"inf"``."""
    u = ulps.to(torch.float64).flatten()
    out = {"0": int((u == 0).sum())}
    for lo, hi in zip(edges, edges[1:]):
        out[f"({lo:g},{hi:g}]"] = int(((u > lo) & (u <= hi)).sum())
    out[f">{edges[-1]:g}"] = int(((u > edges[-1]) & torch.isfinite(u)).sum())
    out["inf"] = int((~torch.isfinite(u)).sum())
    return out


def rel_frobenius(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """``||ref - approx||_F / ||ref||_F`` (float64; inf for a zero ref with a nonzero difference)."""
    ref, approx = ref.to(torch.float64), approx.to(torch.float64)
    num, den = torch.linalg.vector_norm(ref - approx).item(), torch.linalg.vector_norm(ref).item()
    return 0.0 if num == 0 else (num / den if den > 0 else math.inf)


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio ``10 log10(||ref||^2 / ||ref - approx||^2)`` in dB."""
    ref, approx = ref.to(torch.float64), approx.to(torch.float64)
    noise = (ref - approx).pow(2).sum().item()
    sig = ref.pow(2).sum().item()
    return float("inf") if noise == 0 else 10 * math.log10(sig / noise) if sig > 0 else -float("inf")


def sqnr_per_channel_db(ref: torch.Tensor, approx: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """SQNR (dB) of each slice ``ref.select(dim, c)`` against ``approx``'s: one value per channel."""
    ref, approx = ref.to(torch.float64).movedim(dim, 0), approx.to(torch.float64).movedim(dim, 0)
    sig = ref.pow(2).flatten(1).sum(1)
    noise = (ref - approx).pow(2).flatten(1).sum(1)
    db = 10 * torch.log10(sig / noise)
    db = torch.where(noise == 0, torch.full_like(db, math.inf), db)
    return torch.where((sig == 0) & (noise > 0), torch.full_like(db, -math.inf), db)


# ---- exact GEMM error ------------------------------------------------------------------------------------
_SPLIT = 2.0 ** 27 + 1  # Veltkamp: x = hi + lo, hi with 26 bits, exact products hi*hi, hi*lo, lo*lo


def _two_product(a, b):
    """p + e == a * b exactly (float64, no overflow or underflow)."""
    p = a * b
    c = _SPLIT * a
    ah = c - (c - a)
    c = _SPLIT * b
    bh = c - (c - b)
    al, bl = a - ah, b - bh
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _two_sum(a, b):
    s = a + b
    z = s - a
    return s, (a - (s - z)) + (b - z)


def matmul_error(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """An upper bound (M, N) float64 on ``|out - a @ b|``, tight to 2^-52 relative plus
    ``gamma(2K, 2^-53)^2 sum(|terms|)`` absolute.

    ``a`` (M, K) and ``b`` (K, N) hold their exact values in float64 (fp32 values, dequantized FP8/FP4
    operands). Each product is split exactly (Dekker's TwoProduct) and ``out - sum(p + e)`` summed
    by Ogita-Rump-Oishi's Sum2 (TwoSum cascade: as accurate as doubled precision, then rounded), whose
    error bound is added. NaN where ``out`` is NaN or the row of ``a`` / column of ``b`` holds a
    non-finite value."""
    A, B = (t.detach().cpu().to(torch.float64).numpy() for t in (a, b))
    O = out.detach().cpu().to(torch.float64).numpy()
    bad = np.isnan(O) | ~np.isfinite(A).all(1)[:, None] | ~np.isfinite(B).all(0)[None, :]
    A, B = np.nan_to_num(A, nan=0.0, posinf=0.0, neginf=0.0), np.nan_to_num(B, nan=0.0, posinf=0.0, neginf=0.0)
    s, c = np.where(bad, 0.0, O), np.zeros_like(O)
    mag = np.abs(s)
    for k in range(A.shape[1]):
        p, e = _two_product(A[:, k:k + 1], B[k:k + 1, :])
        s, q = _two_sum(s, -p)
        c += q
        s, q = _two_sum(s, -e)
        c += q
        mag += np.abs(p) + np.abs(e)
    n = 2 * A.shape[1] + 1
    err = np.abs(s + c) * (1 + 2.0 ** -52) + gamma(n, 2.0 ** -53) ** 2 * mag * (1 + n * 2.0 ** -52)
    return torch.from_numpy(np.where(bad, np.nan, err))


# ---- bounds ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TensorCore:
    """Accumulator model of a matrix unit (module docstring): ``bits`` kept by truncation while summing
    ``group`` products at a time; ``promote``: products per chain before the fp32 promotion (None:
    the whole K is one chain)."""
    name: str
    bits: int
    group: int
    promote: Optional[int] = None

    def with_promotion(self, promote: Optional[int]) -> "TensorCore":
        return dataclasses.replace(self, promote=promote)


HOPPER_FP8 = TensorCore("hopper-fp8", bits=14, group=32)
HOPPER_BF16 = TensorCore("hopper-bf16", bits=23, group=16)


def tensor_core_bound(a: torch.Tensor, b: torch.Tensor, core: TensorCore, n_chunks: int = 1) -> torch.Tensor:
    """Elementwise bound (float64, (M, N)) of ``a @ b`` computed by ``core`` (module docstring);
    ``n_chunks``: scale multiplications per output (blockwise: one per 128-K chunk)."""
    A = torch.nan_to_num(a.detach().cpu().to(torch.float64).abs(), nan=0.0, posinf=0.0)
    B = torch.nan_to_num(b.detach().cpu().to(torch.float64).abs(), nan=0.0, posinf=0.0)
    M, K = A.shape
    L = min(core.promote or K, K) or 1
    chains = -(-K // L)
    pad = chains * L - K
    u = 2.0 ** (1 - core.bits)
    steps = -(-L // core.group)
    out = torch.empty(M, B.shape[1], dtype=torch.float64)
    Bp = torch.nn.functional.pad(B, (0, 0, 0, pad))
    for i in range(M):
        P = torch.nn.functional.pad(A[i], (0, pad))[:, None] * Bp  # (chains*L, N)
        P = P.view(chains, L, -1)
        S = P.sum(1, keepdim=True)  # (chains, 1, N)
        out[i] = (torch.minimum(P, u * S).sum(1) + steps * u * S[:, 0]).sum(0)
    total = A @ B
    return (out + gamma(chains + n_chunks + 2) * total) * _F64_SLACK


def quantization_bound(x: torch.Tensor, scale: torch.Tensor, fmt, stochastic: bool = False) -> torch.Tensor:
    """Elementwise bound on ``|scale * Q(x) - x|`` (module docstring); ``scale`` expanded to x's shape.
    Non-finite x get inf."""
    fmt = get_format(fmt)
    X = x.to(torch.float64).abs()
    s = scale.to(torch.float64).abs().expand_as(X)
    u = 2.0 ** -fmt.mbits if stochastic else 2.0 ** -(fmt.mbits + 1)
    sub = fmt.min_subnormal if stochastic else fmt.min_subnormal / 2
    bd = (u + 2.0 ** -23) * X + s * sub + torch.clamp(X - fmt.max * s, min=0)
    return torch.where(torch.isfinite(X), bd * _F64_SLACK, torch.full_like(bd, math.inf))


def quantized_matmul_bound(a: torch.Tensor, b: torch.Tensor, ea: torch.Tensor, eb: torch.Tensor,
                           acc: torch.Tensor) -> torch.Tensor:
    """Bound on ``|C - a @ b|`` given operand error bounds ``ea``, ``eb`` (elementwise, >= 0) and the
    accumulation bound ``acc`` of the quantized product: ``acc + ea|b| + |a|eb + ea eb``."""
    A, B = a.to(torch.float64).abs(), b.to(torch.float64).abs()
    ea, eb = ea.to(torch.float64), eb.to(torch.float64)
    return acc + (ea @ B + A @ eb + ea @ eb) * _F64_SLACK


def output_rounding_bound(exact_abs: torch.Tensor, acc: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``acc + u_out (|C*| + acc)``: a bound ``acc`` before the cast to ``out_dtype`` (RNE), after it."""
    u = {torch.float32: 0.0, torch.bfloat16: U_BF16, torch.float16: 2.0 ** -11}[out_dtype]
    return acc + u * (exact_abs.to(torch.float64) + acc)


def underflow_bound(n_ops: int, row_scale: torch.Tensor, col_scale: torch.Tensor,
                    codes_dot: torch.Tensor) -> torch.Tensor:
    """``n_ops 2^-150 (1 + sA_i)(1 + sB_j)(1 + C_ij)``, (M, N) float64 (module docstring)."""
    ra = 1 + row_scale.to(torch.float64).abs().reshape(-1, 1)
    cb = 1 + col_scale.to(torch.float64).abs().reshape(1, -1)
    return n_ops * 2.0 ** -150 * ra * cb * (1 + codes_dot.to(torch.float64))

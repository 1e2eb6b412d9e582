"""GEMM checks: ``scaled_mm`` of every format pair against the exact product, as error / bound.

Operands are quantized by the reference casts (``FP8Tensor`` / ``FP4Tensor.from_float``, so a cast
bug cannot hide a GEMM bug), then multiplied by each backend. Two ratios per output, reported as
their maximum (both <= 1 to pass):

* against the exact product ``E`` of the dequantized operands (``metrics.matmul_error``): the
  accumulation bound of the machine that ran it: round-to-nearest fp32 (``gemm_bound``, the CPU
  and the torch emulation), or on a GPU the tensor-core model (``metrics.tensor_core_bound``:
  ``HOPPER_FP8`` promoted every 128 K, or never with ``fast_accum``, every scale chunk for
  blockwise and MX; ``HOPPER_BF16`` over the whole K for the FP4 kernels, which dequantize to bf16);
  plus the rounding to the output dtype;
* against the exact product of the high-precision inputs (rows and columns with finite inputs):
  that bound plus the quantization bound of both operands (``quantized_matmul_bound``).

NaN: an output is NaN exactly where its row of A or column of B holds a NaN after quantization
(a NaN element, or an FP4/MX block with a NaN scale); anywhere else NaN or inf fails.

Under the Triton interpreter (the "triton" backend on the CPU) two checks cannot be made, because
the interpreter (triton 3.9) decodes FP8 NaN codes as finite numbers (E4M3 0x7F as 480) and its
``tl.dot`` mangles E5M2 and bf16 subnormals (E5M2 2^-16 -> 0, 3 * 2^-16 -> 2^-15; a bf16 2^-130 ->
~3e5): there, E5M2 subnormal codes and bf16 subnormal activations are zeroed before the product
(the reference uses the same operands) and outputs whose exact value is NaN are not compared; the
row's inputs say so (``INTERPRETER_NOTE``). On a GPU nothing is left out.
"""
from __future__ import annotations

import math

import torch

from ..dtypes import FP4Tensor, FP8Tensor
from ..scaling import MX, NV, Blockwise, Current, Rowwise, expand_scale
from .inputs import GEMM_KINDS, gemm_inputs
from .kernel_checks import AuditConfig, CheckResult, failed_row
from .metrics import (HOPPER_BF16, HOPPER_FP8, gemm_bound, matmul_error, output_rounding_bound,
                      quantization_bound, quantized_matmul_bound, tensor_core_bound, underflow_bound)

__all__ = ["GEMM_CASES", "run", "INTERPRETER_NOTE"]

INTERPRETER_NOTE = "interpreter: e5m2/bf16 subnormals zeroed, NaN rows unchecked"

# (label, recipe, A role, A is plain bf16 (weight-only), fast_accum)
GEMM_CASES = (
    ("fp8-current e4m3 x e4m3", Current(), "input", False, False),
    ("fp8-current e4m3 x e4m3 fast_accum", Current(), "input", False, True),
    ("fp8-current e5m2 x e4m3", Current(), "grad", False, False),
    ("fp8-rowwise e4m3 x e4m3", Rowwise(), "input", False, False),
    ("fp8-block 1x128 x 128x128", Blockwise(), "input", False, False),
    ("mxfp8 e4m3", MX(elem="e4m3", scale_rule="rceil"), "input", False, False),
    ("nvfp4 x nvfp4", NV(), "input", False, False),
    ("mxfp4 x mxfp4", MX(elem="e2m1"), "input", False, False),
    ("bf16 x nvfp4 (weight-only)", NV(), "input", True, False),
)


def _quantize(x: torch.Tensor, recipe, role: str):
    if recipe.kind == "fp4":
        return FP4Tensor.from_float(x, recipe, role)
    return FP8Tensor.from_float(x, recipe, role)


def _elem_scale(t) -> torch.Tensor:
    """Each element's dequantization factor (float64, t's logical shape)."""
    if isinstance(t, FP4Tensor):
        s = expand_scale(t.block_scale_fp32(), tuple(t.shape), t.block).to(torch.float32)
        return (s * t._global_scale.to(torch.float32)).to(torch.float64)  # fp32(s_block * s_global), as cast
    return expand_scale(t.scale_fp32(), tuple(t.shape), t.block).to(torch.float64).expand(tuple(t.shape))


def _chunk(recipe, K: int) -> int:
    """K extent inside which both operands' scales are constant (the kernels' promotion chunk)."""
    if isinstance(recipe, Blockwise):
        return 128
    if isinstance(recipe, MX) and recipe.kind == "fp8":
        return recipe.block
    return K


def _acc_bound(A, B, recipe, device: str, backend: str, fast: bool):
    K = A.shape[1]
    c = _chunk(recipe, K)
    n = -(-K // c)
    if device != "cuda" or backend == "torch":  # fp32 round-to-nearest: the interpreter, the emulation
        return gemm_bound(A, B, n)
    if recipe.kind == "fp4":
        return tensor_core_bound(A, B, HOPPER_BF16, n)
    promote = c if c < K else (None if fast else 128)
    return tensor_core_bound(A, B, HOPPER_FP8.with_promotion(promote), n)


def _without_subnormals(t):
    """``t`` with its E5M2 subnormal codes, or a plain bf16 tensor's subnormals, zeroed (sign kept)."""
    if isinstance(t, FP8Tensor) and t._data.dtype == torch.float8_e5m2:
        v = t._data.to(torch.float32)
        v = torch.where(v.abs() < 2.0 ** -14, v * 0, v).to(torch.float8_e5m2)
        return FP8Tensor(v, t._scale, t.block, t._orig_dtype)
    if not isinstance(t, (FP8Tensor, FP4Tensor)) and t.dtype == torch.bfloat16:
        return torch.where(t.float().abs() < 2.0 ** -126, t * 0, t)
    return t


def _run_case(label, recipe, role, plain_a, fast, backend, kind, M, N, K, out_dtype, config) -> CheckResult:
    from ..kernels import scaled_mm
    shape = f"{M}x{N}x{K}"
    interp = backend != "torch" and config.device == "cpu"
    inputs = kind + (f", out {str(out_dtype).replace('torch.', '')}" if out_dtype != torch.float32 else "") + \
        (f" ({INTERPRETER_NOTE})" if interp else "")
    try:
        x, w = gemm_inputs(kind, M, N, K, config.seed)
        if plain_a:
            x = x.to(torch.bfloat16)
        a = x.to(config.device) if plain_a else _quantize(x.to(config.device), recipe, role)
        b = _quantize(w.to(config.device), recipe, "weight")
        if interp:
            a, b = _without_subnormals(a), _without_subnormals(b)
            x = a if plain_a else x
        b = b.t()
        out = scaled_mm(a, b, out_dtype, backend=backend, fast_accum=fast).cpu()
        A = x.to(torch.float64) if plain_a else a.dequantize(torch.float64).cpu()
        B = b.dequantize(torch.float64).cpu()
        ratio, detail = _ratios(out, x, w, a, b, A, B, recipe, config.device, backend, fast, out_dtype, plain_a,
                                check_nan=not interp)
    except Exception as e:  # noqa: BLE001 - a kernel that raises is a failed row
        return failed_row("scaled_mm", backend, label, shape, inputs, "bound ratio", 1, e)
    return CheckResult("scaled_mm", backend, label, shape, inputs, "bound ratio", ratio, 1.0,
                       ratio <= 1.0, detail)


def _ratios(out, x, w, a, b, A, B, recipe, device, backend, fast, out_dtype, plain_a, check_nan=True):
    nan_rows, nan_cols = torch.isnan(A).any(1), torch.isnan(B).any(0)
    want_nan = nan_rows[:, None] | nan_cols[None, :]
    got_nan = torch.isnan(out)
    problems = []
    if not check_nan:
        out = torch.where(want_nan, torch.full_like(out, math.nan), out)
        got_nan = torch.isnan(out)
    if not torch.equal(got_nan, want_nan):
        problems.append(f"NaN at {int((got_nan & ~want_nan).sum())} position(s) that must be finite, "
                        f"missing at {int((want_nan & ~got_nan).sum())}")
    if bool(torch.isinf(out).any()):
        problems.append(f"{int(torch.isinf(out).sum())} inf output(s)")
    ok = ~want_nan
    Af, Bf = torch.nan_to_num(A, nan=0.0), torch.nan_to_num(B, nan=0.0)
    ea_s = torch.ones_like(Af) if plain_a else _elem_scale(a).cpu()
    eb_s = _elem_scale(b).cpu()
    codes = (Af / ea_s).abs() @ (Bf / eb_s).abs()
    n = -(-A.shape[1] // _chunk(recipe, A.shape[1]))
    acc = _acc_bound(Af, Bf, recipe, device, backend, fast) + \
        underflow_bound(A.shape[1] + 2 * n + 4, ea_s.amax(1), eb_s.amax(0), torch.nan_to_num(codes, nan=0.0))
    err = matmul_error(torch.where(ok, out.to(torch.float64), 0.0), Af, Bf)
    absE = (Af @ Bf).abs()
    bound = output_rounding_bound(absE, acc, out_dtype)
    r_codes = _max_ratio(err, bound, ok)
    X, W = x.to(torch.float64), w.to(torch.float64).t()
    fin = torch.isfinite(X).all(1)[:, None] & torch.isfinite(W).all(0)[None, :] & ok
    ea = torch.zeros_like(X) if plain_a else quantization_bound(x, _elem_scale(a).cpu(), a.fmt)
    eb = quantization_bound(w.t(), _elem_scale(b).cpu(), b.fmt)
    Xf, Wf = torch.nan_to_num(X, nan=0.0, posinf=0.0, neginf=0.0), torch.nan_to_num(W, nan=0.0, posinf=0.0, neginf=0.0)
    q_bound = quantized_matmul_bound(Xf, Wf, torch.nan_to_num(ea, posinf=0.0), torch.nan_to_num(eb, posinf=0.0), bound)
    err_in = matmul_error(torch.where(fin, out.to(torch.float64), 0.0), Xf, Wf)
    r_inputs = _max_ratio(err_in, q_bound, fin)
    ratio = max(r_codes, r_inputs) if not problems else math.inf
    detail = f"codes {r_codes:.3g}, inputs {r_inputs:.3g}" + (f"; {'; '.join(problems)}" if problems else "")
    return ratio, detail


def _max_ratio(err: torch.Tensor, bound: torch.Tensor, mask: torch.Tensor) -> float:
    if not bool(mask.any()):
        return 0.0
    e, b = err[mask], bound[mask]
    r = torch.where(e == 0, torch.zeros_like(e), e / b)
    return float(torch.nan_to_num(r, nan=math.inf).max())


def _shapes(config: AuditConfig, recipe) -> list:
    small = (16, 48, 320 if isinstance(recipe, Blockwise) else 256)
    if config.quick:
        return [small]
    return [small, (128, 128, 1024), (16, 32, 16384)]  # 128 x 128: the Gluon GEMMs on sm_90


def run(config: AuditConfig) -> list:
    """Every GEMM case x shape x input kind x backend (quick: the adversarial input only, which
    holds random rows too)."""
    kinds = ("adversarial",) if config.quick else GEMM_KINDS
    out = []
    for label, recipe, role, plain_a, fast in GEMM_CASES:
        for M, N, K in _shapes(config, recipe):
            for kind in kinds:
                for backend in config.backends:
                    if fast and backend == "torch":
                        continue  # the exact emulation has no fast accumulation
                    out.append(_run_case(label, recipe, role, plain_a, fast, backend, kind, M, N, K,
                                         torch.float32, config))
        if not config.quick and not plain_a and recipe.kind == "fp8":
            for backend in config.backends:
                out.append(_run_case(label, recipe, role, plain_a, fast, backend, "random", 128, 128, 1024,
                                     torch.bfloat16, config))
    return out

"""Attention checks: FP8 attention's output and gradients against float64, as a ratio to the
accuracy contract.

Each backend runs ``lowbit.kernels.attention_forward`` / ``attention_backward`` (the default
``AttentionRecipe``) on outlier inputs (``attention_baseline.outlier_inputs``: N(0, 1), 0.1% of the
values 20x; float32). One row per tensor part (out, dq, dk, dv):
``ratio = rel(kernel, exact) / (1.25 * rel(plain E4M3, exact))``, limit 1 (the contract of
``attention_baseline``). The reference is float64 autograd (``attention_baseline.exact``); at
the small shapes (``B Hq S^2 D <= 4e5``: the quick ones) the check first confirms its forward
against ``references.attention`` (mpmath, correctly rounded to float64; relative L2 below 1e-12),
beyond that mpmath would take minutes. A NaN or inf anywhere in a kernel's result fails its row.

Shapes (batch, query heads, key/value heads, tokens, head dim, causal): quick, a GQA causal case
whose 40 tokens leave a partial tile and a non-causal one at head dim 128; otherwise also 77 tokens
with GQA and 128 causal tokens at head dim 64 (on a GPU: 1024 tokens at 128).
"""
from __future__ import annotations

import math

import torch

from ..kernels import attention as attention_kernels
from ..scaling import AttentionRecipe
from . import references
from .attention_baseline import CONTRACT, exact, outlier_inputs, plain_e4m3, rel
from .kernel_checks import AuditConfig, CheckResult, failed_row

__all__ = ["run", "run_case", "references_for", "SHAPES", "QUICK"]

PARTS = ("out", "dq", "dk", "dv")
QUICK = ((1, 2, 1, 40, 64, True), (1, 2, 2, 33, 128, False))
SHAPES = QUICK + ((2, 4, 2, 77, 128, False), (1, 2, 2, 128, 64, True))
GPU_EXTRA = ((1, 2, 2, 1024, 128, True),)
_REF_AGREE = 1e-12
_MPMATH_WORK = 4e5  # B * Hq * S^2 * D up to which the float64 forward is checked against mpmath
INPUTS = "N(0,1), 0.1% x20"


def _shapes(config: AuditConfig) -> tuple:
    if config.quick:
        return QUICK
    return SHAPES + (GPU_EXTRA if config.device != "cpu" else ())


def _kernel(q, k, v, dout, causal, backend, device):
    kw = dict(causal=causal, scale=q.shape[-1] ** -0.5, recipe=AttentionRecipe(), backend=backend)
    q, k, v, dout = (t.to(device) for t in (q, k, v, dout))
    out, lse, used = attention_kernels.attention_forward(q, k, v, **kw)
    grads = attention_kernels.attention_backward(dout, q, k, v, out, lse, **dict(kw, backend=used))
    return [t.detach().cpu() for t in (out, *grads)]


def _label(shape) -> str:
    B, hq, hkv, S, D, causal = shape
    return f"B{B} Hq{hq} Hkv{hkv} S{S} D{D}" + (" causal" if causal else "")


def _failed(shape, backend: str, err: BaseException) -> list:
    return [failed_row("attention", backend, f"fp8 {p}", _label(shape), INPUTS, "bound ratio", 1, err) for p in PARTS]


def run_case(shape, backend: str, config: AuditConfig, ref: dict) -> list:
    """The four rows of one shape on one backend (``ref``: ``references_for(shape)``)."""
    label, causal = _label(shape), shape[-1]
    q, k, v, dout = ref["inputs"]
    try:
        got = _kernel(q, k, v, dout, causal, backend, config.device)
    except Exception as e:  # noqa: BLE001 - a kernel that raises is a failed row
        return _failed(shape, backend, e)
    rows = []
    for part, g, r, b in zip(PARTS, got, ref["exact"], ref["base"]):
        finite = bool(torch.isfinite(g).all())
        err = rel(g, r) if finite else math.inf
        ratio = err / (CONTRACT * b)
        detail = f"rel L2 {err:.3g}, plain E4M3 {b:.3g}" + ("" if finite else "; non-finite values")
        rows.append(CheckResult("attention", backend, f"fp8 {part}", label, INPUTS, "bound ratio", ratio, 1.0,
                                finite and ratio <= 1.0, detail))
    return rows


def references_for(shape, seed: int = 0) -> dict:
    """The inputs of ``shape``, their float64 (O, dQ, dK, dV) and the plain E4M3 errors."""
    B, hq, hkv, S, D, causal = shape
    q, k, v, dout = outlier_inputs([(B, hq, S, D), (B, hkv, S, D), (B, hkv, S, D), (B, hq, S, D)], seed)
    ex = exact(q, k, v, dout, causal)
    if B * hq * S * S * D <= _MPMATH_WORK:
        mp = references.attention(q, k, v, scale=D ** -0.5, causal=causal, fmt="fp64")
        agree = rel(ex[0], mp)
        if not agree < _REF_AGREE:
            raise ArithmeticError(f"float64 attention disagrees with the mpmath reference: rel L2 {agree:.3g}")
    base = [rel(a, r) for a, r in zip(plain_e4m3(q, k, v, dout, causal), ex)]
    return {"inputs": (q, k, v, dout), "exact": ex, "base": base}


def run(config: AuditConfig) -> list:
    """Every shape x backend (module docstring)."""
    out = []
    for i, shape in enumerate(_shapes(config)):
        try:
            ref = references_for(shape, config.seed + i)
        except Exception as e:  # noqa: BLE001 - a reference that cannot be trusted fails the rows
            out.extend(row for backend in config.backends for row in _failed(shape, backend, e))
            continue
        for backend in config.backends:
            out.extend(run_case(shape, backend, config, ref))
    return out

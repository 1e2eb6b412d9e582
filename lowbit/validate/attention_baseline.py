"""What FP8 attention's accuracy is stated against: outlier inputs, float64 attention with its
gradients, and the plain per-head E4M3 baseline.

* ``outlier_inputs(shapes, seed)``: N(0, 1) with 0.1% of the values multiplied by 20.
* ``exact(q, k, v, dout, causal, window, scale)``: float64 ``(O, dQ, dK, dV)`` of softmax attention
  by autograd (GQA by repeating K and V); its rounding (~1e-16 relative) is far below any FP8
  error it judges. ``lowbit.validate.references.attention`` is the correctly rounded forward.
* ``plain_e4m3(...)``: every GEMM operand rounded to E4M3 with one ``amax / 448`` scale per head,
  everything else exact: ``O = E(P) E(V)`` with ``P`` the exact softmax of ``E(Q) E(K)^T * scale``;
  ``dV = E(P)^T E(dO)``, ``dP = E(dO) E(V)^T``, ``dS = P (dP - delta)``, ``dQ = E(dS) E(K) scale``,
  ``dK = E(dS)^T E(Q) scale`` (``delta`` from the exact output). The accuracy contract of
  ``lowbit.nn.scaled_dot_product_attention``: each of O, dQ, dK, dV within 1.25x of this
  baseline's relative L2 error against ``exact``.
* ``rel(a, b)``: relative L2 error ``|a - b| / |b|``.
"""
from __future__ import annotations

import math

import torch

from ..kernels.attention_emulation import visible

__all__ = ["outlier_inputs", "exact", "plain_e4m3", "rel", "CONTRACT"]

CONTRACT = 1.25  # error / plain E4M3 error, each of O, dQ, dK, dV


def outlier_inputs(shapes, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    out = []
    for shape in shapes:
        x = torch.randn(shape, generator=g, dtype=torch.float64)
        x = torch.where(torch.rand(shape, generator=g) < 1e-3, 20 * x, x)
        out.append(x.to(dtype))
    return out


def _expand(t, hq):
    return t.repeat_interleave(hq // t.shape[1], dim=1)


def _fold(t, hkv):
    return t.unflatten(1, (hkv, t.shape[1] // hkv)).sum(2)


def exact(q, k, v, dout, causal=False, window=(None, None), scale=None):
    """float64 (O, dQ, dK, dV) of softmax attention (GQA by repeating K and V)."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    scale = scale or 1 / math.sqrt(q.shape[-1])
    s = q @ _expand(k, q.shape[1]).transpose(-1, -2) * scale
    s = s.masked_fill(~visible(s.shape[-2], s.shape[-1], causal, window), float("-inf"))
    o = torch.softmax(s, -1).nan_to_num(0.0) @ _expand(v, q.shape[1])
    o.backward(dout.double())
    return o.detach(), q.grad, k.grad, v.grad


def _e4m3(x):
    s = x.abs().amax(dim=(-2, -1), keepdim=True) / 448
    s = torch.where(s > 0, s, torch.ones_like(s))
    return (x / s).float().to(torch.float8_e4m3fn).double() * s


def plain_e4m3(q, k, v, dout, causal=False, window=(None, None), scale=None):
    """The baseline (module docstring): (O, dQ, dK, dV) in float64."""
    q, k, v, dout = (t.double() for t in (q, k, v, dout))
    hq, hkv = q.shape[1], k.shape[1]
    scale = scale or 1 / math.sqrt(q.shape[-1])
    eq, ek, ev, edo = _e4m3(q), _expand(_e4m3(k), hq), _expand(_e4m3(v), hq), _e4m3(dout)
    s = (eq @ ek.transpose(-1, -2) * scale).masked_fill(~visible(q.shape[2], k.shape[2], causal, window),
                                                         float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    ep = _e4m3(p)
    o = ep @ ev
    delta = (dout * (p @ _expand(v, hq))).sum(-1, keepdim=True)
    ds = _e4m3(p * (edo @ ev.transpose(-1, -2) - delta))
    return o, ds @ ek * scale, _fold(ds.transpose(-1, -2) @ eq * scale, hkv), _fold(ep.transpose(-1, -2) @ edo, hkv)


def rel(a, b) -> float:
    """Relative L2 error of ``a`` against ``b``."""
    return ((a.double() - b.double()).norm() / b.double().norm()).item()

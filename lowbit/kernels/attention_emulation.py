"""Exact emulation of lowbit's FP8 attention in torch (any device): the numbers the Triton kernels
compute, up to the order of fp32 accumulation and the last bits of ``exp2``, with every product of
E4M3 codes summed exactly (``accumulator=None``: what the interpreter computes) or by a model of
the tensor cores' accumulator (``accumulator=lowbit.validate.metrics.HOPPER_FP8``: what an
H100/H200 computes, ``tensor_core_mm``).

Layout (B, H, S, D) for one batch of equal-length sequences (varlen callers split the packed
sequences and call these once per sequence). Notation (``lowbit.scaling.attention`` has the
recipe): ``qc, kc, vc`` the E4M3 codes, ``sq, sk, sv`` their per-token (block-constant) fp32
scales (``amax / 448`` per block), ``c = scale * log2(e) / hb`` (hb: Hadamard block, 1 without
rotation), ``g_i = sq_i c``; products of fp32 numbers below are rounded to fp32 in the order written.

Forward, for each query row i, over key blocks ``j`` of ``block_n`` keys taken from the last to the
first (the kernel's order: the diagonal block first, so a sink token early in the sequence cannot
push later keys' P below E4M3's range):

* ``s = qc kc^T`` (exact products; the tensor cores sum the head dim, at most 256 terms; here
  float64 then fp32), masked keys ``-inf``;
* ``M_j = max(M_{j+1}, max_k(s_jk) * sk_j)``, the running max in units of ``1 / g_i``;
  ``r_j = max(max_k s_jk, M_j * (1 / sk_j))`` (M_j's raw-score equivalent; the max makes
  ``s - r_j <= 0`` by construction), ``p = exp2((s - r_j) * (sk_j g_i))``: subtract, then
  multiply, so no contraction can make an exponent positive; ``p8 = RNE_e4m3(256 p) / 256``;
* ``acc = sum_j (p8_j vc_j) sv_j w_j`` and ``l = sum_j rowsum(p_j) w_j`` with
  ``w_j = exp2((M_j - M) g_i)`` (the product of the kernel's rescale factors), ``O = acc / l``
  (0 where a row sees no key), ``lse = M g_i + log2 l`` (log2 units, -inf for such rows).

Backward: ``p = exp2(s (sq sk c) - lse)``, ``dV = sum_i (p8_i^T doc_i) sdo_i`` over query blocks
i of ``block_m``, ``dP = (doc vc^T) sdo sv``, ``dS = p (dP - delta)`` with ``delta_i = sum(dO_i O_i)``;
dS is rounded to E4M3 row by row: for dK each key's ``block_m`` entries of a query block share
one scale ``amax / 448``, for dQ each query's ``block_n`` entries of a key block;
``dQ' = sum_j (dS8_j kc_j) u_j sk_j c_ln``, ``dK' = sum_i (dS8_i^T qc_i) t_i sq_i c_ln``
(``c_ln = scale / hb``), rotated back by R^T.

Products of codes are summed per kernel tile: the scores and dP over the head dim, PV over a
forward key block, dV and dK over a ``block_m`` query block, dQ over a ``block_n`` key block; each
tile's sum starts from zero and the scaled tile results are added in float64 (the kernels add in
fp32). The tensor-core model (``accumulator``, anything with ``bits`` and ``group``, e.g.
``lowbit.validate.metrics.TensorCore``; its ``promote`` is not used, the tiles are the chains):
a tile's products are taken ``group`` at a time (consecutive along the sum), and each group
together with the running sum is aligned to the largest magnitude among them and truncated
toward zero to ``bits`` significant bits (``2^(e_max - bits + 1)`` multiples), then added.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..dtypes.formats import E4M3, Format
from ..dtypes.quantize import round_to_grid
from ..scaling.attention import P_SCALE, AttentionRecipe
from ..scaling.blocks import finite_abs
from ..scaling.scales import amax_to_scale

__all__ = ["quantize_tokens", "visible", "emulated_forward", "emulated_backward", "tensor_core_mm", "LOG2E"]

LOG2E = 1.4426950408889634
FP32_MIN_NORMAL = 2.0 ** -126


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _tiles(x: torch.Tensor, dim: int, size: int, fill: float) -> torch.Tensor:
    """``x`` padded along ``dim`` to a multiple of ``size`` and split: that dim becomes (n, size)."""
    n = x.shape[dim]
    pad = _cdiv(n, size) * size - n
    if pad:
        widths = [0, 0] * (x.dim() - 1 - dim % x.dim()) + [0, pad]
        x = torch.nn.functional.pad(x, widths, value=fill)
    return x.unflatten(dim, (-1, size))


def _scale(amax: torch.Tensor, bad: torch.Tensor, fmt: Format):
    """(scale, 1 / scale): ``max(amax / fmax, 2^-126)`` (fp32, IEEE; the floor keeps 1 / scale
    finite), 1 for amax 0; NaN where the block holds inf/NaN."""
    s = torch.clamp(amax_to_scale(amax, fmt), min=FP32_MIN_NORMAL)
    s = torch.where(bad, torch.full_like(s, float("nan")), s)
    return s, torch.ones_like(s) / s


def _codes(x: torch.Tensor, inv: torch.Tensor, fmt: Format) -> torch.Tensor:
    """``RNE_fmt(x * inv)`` as fp32 values, saturating (the kernels multiply by the reciprocal)."""
    return round_to_grid(x * inv, fmt)


def quantize_tokens(x: torch.Tensor, block: int, fmt: Format = E4M3) -> Tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of fp32 ``x`` (B, H, S, D): one scale ``amax / fmax`` per ``block`` tokens of
    each head (``block=0``: per head) and codes ``RNE(x * (1 / scale))``: fp32 values on ``fmt``'s
    grid. Scales come back per token, shape (B, H, S, 1)."""
    S = x.shape[2]
    bs = block or max(S, 1)
    xb = _tiles(x, 2, bs, 0.0)  # (B, H, nb, bs, D)
    amax = finite_abs(xb).amax(dim=(-2, -1))
    bad = ~torch.isfinite(xb).all(dim=-1).all(dim=-1)
    s, inv = _scale(amax, bad, fmt)
    codes = _codes(xb, inv[..., None, None], fmt).flatten(2, 3)[:, :, :S]
    return codes, s.repeat_interleave(bs, dim=-1)[..., :S, None]


def visible(sq: int, sk: int, causal: bool, window: Tuple[Optional[int], Optional[int]], device=None) -> torch.Tensor:
    """(sq, sk) bool: query i sees key j when ``j <= i`` (causal, top-left aligned as torch's
    ``is_causal``) and ``i - left <= j <= i + right`` (``window``; None: unbounded)."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    left, right = window
    if causal:
        ok &= j <= i
    if left is not None:
        ok &= j >= i - left
    if right is not None:
        ok &= j <= i + right
    return ok


def _prepare(q, k, v, recipe: AttentionRecipe):
    """Rotated (if asked) fp32 Q, K and their codes; V codes; the rotation and its block."""
    rot = recipe.rotation(q.shape[-1], q.device)
    qf, kf = q.float(), k.float()
    if rot is not None:
        qf = (qf.double() @ rot.double()).float()
        kf = (kf.double() @ rot.double()).float()
    qc, sq = quantize_tokens(qf, recipe.block)
    kc, sk = quantize_tokens(kf, recipe.block)
    vc, sv = quantize_tokens(v.float(), recipe.block)
    return (qc, sq), (kc, sk), (vc, sv), rot, recipe.rotation_block(q.shape[-1])


def _expand_kv(t: torch.Tensor, hq: int) -> torch.Tensor:
    return t.repeat_interleave(hq // t.shape[1], dim=1) if t.shape[1] != hq else t


def tensor_core_mm(a: torch.Tensor, b: torch.Tensor, accumulator=None) -> torch.Tensor:
    """float64 ``a @ b`` of exact values (E4M3 codes): one chain over the whole K, summed exactly
    (``accumulator`` None) or by the tensor-core model (module docstring)."""
    a, b = a.double(), b.double()
    if accumulator is None:
        return a @ b
    acc = a.new_zeros((*torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1]))
    for k0 in range(0, a.shape[-1], accumulator.group):
        prods = a[..., :, k0:k0 + accumulator.group, None] * b[..., None, k0:k0 + accumulator.group, :]
        big = torch.maximum(prods.abs().amax(-2), acc.abs())
        unit = torch.exp2(torch.floor(torch.log2(torch.where(big > 0, big, torch.ones_like(big))))
                          - (accumulator.bits - 1))
        acc = torch.trunc(acc / unit) * unit + (torch.trunc(prods / unit[..., None, :]) * unit[..., None, :]).sum(-2)
    return acc


def _tiled_mm(a: torch.Tensor, b: torch.Tensor, block: int, accumulator) -> torch.Tensor:
    """(..., nt, M, N): ``a[..., :, t] @ b[..., t, :]`` for each K tile t of ``block`` (zero padded)."""
    return tensor_core_mm(_tiles(a, -1, block, 0.0).movedim(-2, -3), _tiles(b, -2, block, 0.0), accumulator)


def _per_tile(scale: torch.Tensor, block: int) -> torch.Tensor:
    """Per-token scales (..., S, 1) -> one per tile of ``block`` tokens (..., nt, 1, 1) (tiles lie in
    one scale block)."""
    return _tiles(scale, -2, block, 1.0)[..., :1, :]


def _scores(qc, kc, causal, window, accumulator=None):
    """fp32 ``qc kc^T`` (the head dim in one chain), masked keys -inf."""
    s = tensor_core_mm(qc, kc.transpose(-1, -2), accumulator).float()
    vis = visible(s.shape[-2], s.shape[-1], causal, window, s.device)
    return s.masked_fill(~vis, float("-inf"))


def _p_codes(p: torch.Tensor) -> torch.Tensor:
    """The codes of P: ``RNE_e4m3(P * P_SCALE)``."""
    return round_to_grid(p * P_SCALE, E4M3)


def emulated_forward(q, k, v, *, causal: bool, window, scale: float, recipe: AttentionRecipe,
                     block_n: int, accumulator=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(O in q's dtype, lse fp32 (B, H, S) in log2 units) as the kernel computes them (``block_n``
    is clipped to the recipe's scale block, as the kernels' tiles are; ``accumulator``: module
    docstring)."""
    block_n = recipe.tiles(block_n, block_n)[1]
    if q.shape[2] == 0 or k.shape[2] == 0:  # no query, or no key to see: O = 0, lse = -inf
        return q.new_zeros((*q.shape[:3], v.shape[-1])), torch.full(q.shape[:3], float("-inf"), device=q.device)
    (qc, sq), (kc, sk), (vc, sv), _, hb = _prepare(q, k, v, recipe)
    hq = q.shape[1]
    kc, sk, vc, sv = (_expand_kv(t, hq) for t in (kc, sk, vc, sv))
    c = torch.tensor(scale * LOG2E / hb, dtype=torch.float32)
    g = sq * c  # (B, H, Sq, 1)
    s = _scores(qc, kc, causal, window, accumulator)
    skr = sk.transpose(-1, -2)  # (B, H, 1, Sk)
    sb = _tiles(s, -1, block_n, float("-inf"))  # (B, H, Sq, nb, bn)
    skb = _tiles(skr, -1, block_n, 1.0)[..., 0]  # (B, H, 1, nb): one scale per key block
    raw_max = sb.amax(dim=-1)
    m = (raw_max * skb).flip(-1).cummax(dim=-1).values.flip(-1)  # running max, last block first
    alive = m > float("-inf")
    m_ref = torch.where(alive, m, torch.zeros_like(m))
    r = torch.maximum(raw_max, m_ref * (torch.ones_like(skb) / skb))
    f = skb * g
    p = torch.exp2((sb - r[..., None]) * f[..., None])
    m_fin = m[..., :1]
    w = torch.where(alive, torch.exp2((m.double() - m_fin.double()) * g.double()),
                    torch.zeros_like(m, dtype=torch.float64))
    denom = (p.double().sum(-1) * w).sum(-1, keepdim=True)
    pv = _tiled_mm(_p_codes(p).flatten(-2, -1)[..., :s.shape[-1]], vc, block_n, accumulator)  # (B, H, nb, Sq, Dv)
    acc = (pv * (_per_tile(sv, block_n).double() / P_SCALE) * w.movedim(-1, -2)[..., None]).sum(-3)
    out = torch.where(denom > 0, acc / denom, torch.zeros_like(acc))
    lse = (m_fin * g + torch.log2(denom.float()))[..., 0]
    return out.to(q.dtype), lse


def emulated_backward(q, k, v, out, lse, dout, *, causal: bool, window, scale: float, recipe: AttentionRecipe,
                      block_m: int, block_n: int, accumulator=None):
    """(dq, dk, dv) in the inputs' dtypes, as the kernels compute them (module docstring): ``block_m``
    the dK/dV kernel's query step, ``block_n`` the dQ kernel's key step (clipped to the scale block)."""
    block_m, block_n = recipe.tiles(block_m, block_n)
    if q.shape[2] == 0 or k.shape[2] == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    (qc, sq), (kc, sk), (vc, sv), rot, hb = _prepare(q, k, v, recipe)
    doc, sdo = quantize_tokens(dout.float(), recipe.block)
    hq, hkv = q.shape[1], k.shape[1]
    kce, ske, vce, sve = (_expand_kv(t, hq) for t in (kc, sk, vc, sv))
    c = torch.tensor(scale * LOG2E / hb, dtype=torch.float32)
    s = _scores(qc, kce, causal, window, accumulator)
    f = (sq * ske.transpose(-1, -2)) * c  # (sq sk) c, as both backward kernels
    lse_b = torch.where(lse == float("-inf"), torch.full_like(lse, float("inf")), lse)[..., None]
    p = torch.exp2(s * f - lse_b)
    pt = _p_codes(p).transpose(-1, -2)  # (B, H, Sk, Sq)
    dv = (_tiled_mm(pt, doc, block_m, accumulator) * (_per_tile(sdo, block_m).double() / P_SCALE)).sum(-3)
    dp = (tensor_core_mm(doc, vce.transpose(-1, -2), accumulator)
          * (sdo.double() * sve.double().transpose(-1, -2))).float()
    delta = (dout.double() * out.double()).sum(-1, keepdim=True).float()
    ds = p * (dp - delta)
    c_ln = scale / hb
    codes, u = _round_rows(ds, block_n)  # dQ: per query, a key block at a time
    dq = ((_tiled_mm(codes, kce, block_n, accumulator) * u.movedim(-2, -3)) * _per_tile(ske, block_n).double()).sum(-3)
    codes, t = _round_rows(ds.transpose(-1, -2), block_m)  # dK: per key, a query block at a time
    dk = ((_tiled_mm(codes, qc, block_m, accumulator) * t.movedim(-2, -3)) * _per_tile(sq, block_m).double()).sum(-3)
    dq, dk = dq * c_ln, dk * c_ln
    if rot is not None:
        dq, dk = dq @ rot.double().T, dk @ rot.double().T
    if hq != hkv:  # GQA: the heads of a group share K and V
        dk = dk.unflatten(1, (hkv, hq // hkv)).sum(2)
        dv = dv.unflatten(1, (hkv, hq // hkv)).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _round_rows(x: torch.Tensor, width: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(codes (..., R, C), scales (..., R, nt, 1) float64) of ``x`` (..., R, C) rounded to E4M3 with
    one scale ``amax / 448`` per row and ``width`` columns (``common.quantize_rows``); NaN for a
    segment holding inf or NaN."""
    t = _tiles(x, -1, width, 0.0)  # (..., R, nt, width)
    amax = finite_abs(t).amax(dim=-1, keepdim=True)
    sc, inv = _scale(amax, ~torch.isfinite(t).all(dim=-1, keepdim=True), E4M3)
    codes = _codes(t, inv, E4M3).flatten(-2, -1)[..., :x.shape[-1]]
    return codes, sc.double()

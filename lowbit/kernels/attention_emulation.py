"""Exact emulation of lowbit's FP8 attention in torch (any device): the numbers the Triton kernels
compute, up to the order of fp32 accumulation and the last bits of ``exp2``.

Layout (B, H, S, D) for one batch of equal-length sequences (varlen callers split the packed
sequences and call these once per sequence). Notation (``lowbit.scaling.attention`` has the
recipe): ``qc, kc, vc`` the E4M3 codes, ``sq, sk, sv`` their per-token (block-constant) power-of-two
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

Backward: ``p = exp2(s (sq sk c) - lse)``, ``dV = sum_i (p8 sdo)^T doc``, ``dP = (doc vc^T) sdo sv``,
``dS = p (dP - delta)`` with ``delta_i = sum(dO_i O_i)``; dS is rounded to E4M3 per
``block_m x block_n`` tile (scale ``amax / 448``); ``dQ' = dS K c_ln``,
``dK' = dS^T Q c_ln`` with the dequantized codes and ``c_ln = scale / hb``; rotated back by R^T.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..dtypes.formats import E4M3, Format
from ..dtypes.quantize import round_to_grid
from ..scaling.attention import P_SCALE, AttentionRecipe
from ..scaling.blocks import finite_abs
from ..scaling.scales import amax_to_scale

__all__ = ["quantize_tokens", "visible", "emulated_forward", "emulated_backward", "LOG2E"]

LOG2E = 1.4426950408889634


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
    """(scale, 1 / scale): ``amax / fmax`` (fp32, IEEE), 1 for amax 0; NaN where the block holds inf/NaN."""
    s = amax_to_scale(amax, fmt)
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


def _scores(qc, kc, causal, window):
    """fp32 ``qc kc^T`` (float64 sums), masked keys -inf."""
    s = (qc.double() @ kc.double().transpose(-1, -2)).float()
    vis = visible(s.shape[-2], s.shape[-1], causal, window, s.device)
    return s.masked_fill(~vis, float("-inf"))


def _round_p(p: torch.Tensor) -> torch.Tensor:
    return round_to_grid(p * P_SCALE, E4M3) / P_SCALE


def emulated_forward(q, k, v, *, causal: bool, window, scale: float, recipe: AttentionRecipe,
                     block_n: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(O in q's dtype, lse fp32 (B, H, S) in log2 units) as the kernel computes them (``block_n``
    is clipped to the recipe's scale block, as the kernels' tiles are)."""
    block_n = recipe.tiles(block_n, block_n)[1]
    if q.shape[2] == 0 or k.shape[2] == 0:  # no query, or no key to see: O = 0, lse = -inf
        return q.new_zeros((*q.shape[:3], v.shape[-1])), torch.full(q.shape[:3], float("-inf"), device=q.device)
    (qc, sq), (kc, sk), (vc, sv), _, hb = _prepare(q, k, v, recipe)
    hq = q.shape[1]
    kc, sk, vc, sv = (_expand_kv(t, hq) for t in (kc, sk, vc, sv))
    c = torch.tensor(scale * LOG2E / hb, dtype=torch.float32)
    g = sq * c  # (B, H, Sq, 1)
    s = _scores(qc, kc, causal, window)
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
    pw = (_round_p(p).double() * w[..., None]).flatten(-2, -1)[..., : s.shape[-1]]
    acc = (pw * sv.transpose(-1, -2).double()) @ vc.double()
    out = torch.where(denom > 0, acc / denom, torch.zeros_like(acc))
    lse = (m_fin * g + torch.log2(denom.float()))[..., 0]
    return out.to(q.dtype), lse


def emulated_backward(q, k, v, out, lse, dout, *, causal: bool, window, scale: float, recipe: AttentionRecipe,
                      block_m: int, block_n: int):
    """(dq, dk, dv) in the inputs' dtypes, as the kernels compute them (module docstring)."""
    block_m, block_n = recipe.tiles(block_m, block_n)
    if q.shape[2] == 0 or k.shape[2] == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    (qc, sq), (kc, sk), (vc, sv), rot, hb = _prepare(q, k, v, recipe)
    doc, sdo = quantize_tokens(dout.float(), recipe.block)
    hq, hkv = q.shape[1], k.shape[1]
    kce, ske, vce, sve = (_expand_kv(t, hq) for t in (kc, sk, vc, sv))
    c = torch.tensor(scale * LOG2E / hb, dtype=torch.float32)
    s = _scores(qc, kce, causal, window)
    f = (sq * ske.transpose(-1, -2)) * c  # (sq sk) c, as both backward kernels
    lse_b = torch.where(lse == float("-inf"), torch.full_like(lse, float("inf")), lse)[..., None]
    p = torch.exp2(s * f - lse_b)
    dv = (_round_p(p).double() * sdo.double()).transpose(-1, -2) @ doc.double()
    dp = ((doc.double() @ vce.double().transpose(-1, -2)) * (sdo.double() * sve.double().transpose(-1, -2))).float()
    delta = (dout.double() * out.double()).sum(-1, keepdim=True).float()
    ds = p * (dp - delta)
    dsq = _round_ds(ds, block_m, block_n).double()
    c_ln = scale / hb
    dq = (dsq @ (kce.double() * ske.double())) * c_ln
    dk = (dsq.transpose(-1, -2) @ (qc.double() * sq.double())) * c_ln
    if rot is not None:
        dq, dk = dq @ rot.double().T, dk @ rot.double().T
    if hq != hkv:  # GQA: the heads of a group share K and V
        dk = dk.unflatten(1, (hkv, hq // hkv)).sum(2)
        dv = dv.unflatten(1, (hkv, hq // hkv)).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _round_ds(ds: torch.Tensor, block_m: int, block_n: int) -> torch.Tensor:
    """dS as the dQ/dK products see it: E4M3 values, one scale per tile."""
    sq_, sk_ = ds.shape[-2:]
    t = _tiles(_tiles(ds, -1, block_n, 0.0), -3, block_m, 0.0)  # (B, H, nm, bm, nn, bn)
    amax = finite_abs(t).amax(dim=(-3, -1), keepdim=True)
    bad = ~torch.isfinite(t).all(dim=-1, keepdim=True).all(dim=-3, keepdim=True)
    sc, inv = _scale(amax, bad, E4M3)
    out = _codes(t, inv, E4M3) * sc
    return out.flatten(-2, -1).flatten(-3, -2)[..., :sq_, :sk_]

"""Host side of the FP8 attention kernels: layouts, the quantize passes and the launches.

``attention_fwd(q, k, v, ...) -> (out, lse)`` and ``attention_bwd(dout, q, k, v, out, lse, ...)
-> (dq, dk, dv)``. Dense inputs are ``(B, H, S, D)`` with any strides; packed ones
(``cu_seqlens``, int32 offsets of ``nseq + 1`` sequences) are ``(T, H, D)``, and both directions
use the same offsets for queries and keys. Outputs come back in the inputs' dtype and layout (a
dense output shares q's memory order, e.g. ``(B, S, H, D)`` under a ``(B, H, S, D)`` view).

Padded layouts (made by ``quantize.quantize_kernel``, read by the attention kernels without
masks): each sequence of each head is padded to a multiple of ``pad = max(128, recipe.block)``
rows and the head dim to ``DP = next_pow2(D)`` (>= 32) columns; dense inputs keep their batch as
the leading dim, packed ones put sequence b at row ``cu_pad[b]`` of one slice per head. ``lse`` is
returned in the padded layout ``(Z, H, SP)``, as the backward reads it.

The backward quantizes Q, K, V again from the saved inputs (the same codes as the forward: the
cast is deterministic), and dO with ``delta = rowsum(dO * out)`` in the same pass. Under
``TRITON_INTERPRET=1`` (read per call) everything runs on CPU tensors with the small
``tuning.INTERPRET`` tiles; results are written in fp32 and rounded by torch (the interpreter's
own bf16 cast truncates).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from ....scaling.attention import AttentionRecipe
from ..runtime import capability, cdiv, interpreting, runnable
from .backward import attention_dkdv_kernel, attention_dq_kernel
from .common import BIG
from .forward import attention_fwd_kernel
from .quantize import quantize_kernel
from .tuning import AttentionTuning, padded_dim, tuning_for

__all__ = ["attention_fwd", "attention_bwd", "triton_support", "window_offsets"]

LOG2E = 1.4426950408889634
PAD_MIN = 128
MIN_TILE = 32  # FP8 wgmma sums 32 products an instruction: every product's summed tile is >= 32


@dataclass(frozen=True)
class _Geometry:
    """One call's shapes: sequences, heads, head dims (padded), rows of the padded layouts."""
    varlen: bool
    nseq: int
    s_q: int  # dense: the lengths; packed: the longest sequence
    s_k: int
    hq: int
    hkv: int
    d: int
    dv: int
    dp: int
    dvp: int
    pad: int
    z: int  # leading dim of the padded layouts (B dense, 1 packed)
    spq: int  # rows per (z, head) slice
    spk: int
    nbq: int  # scale blocks per sequence
    nbk: int


def _geometry(q, k, v, recipe: AttentionRecipe, cu, max_seqlen) -> _Geometry:
    pad = max(PAD_MIN, recipe.block)
    if cu is None:
        B, hq, s_q, d = q.shape
        s_k = k.shape[2]
        spq, spk, z, nseq = cdiv(s_q, pad) * pad, cdiv(s_k, pad) * pad, B, B
        nbq, nbk = (spq // recipe.block, spk // recipe.block) if recipe.block else (1, 1)
    else:
        T, hq, d = q.shape
        nseq = cu.numel() - 1
        s_q = s_k = max_seqlen
        spq = spk = cdiv(T + nseq * pad, PAD_MIN) * PAD_MIN  # >= the padded rows of all sequences
        z = 1
        nbq = nbk = (cdiv(max_seqlen, pad) * pad // recipe.block) if recipe.block else 1
    return _Geometry(cu is not None, nseq, s_q, s_k, hq, k.shape[-2] if cu is not None else k.shape[1], d,
                     v.shape[-1], padded_dim(d), padded_dim(v.shape[-1]), pad, z, spq, spk, nbq, nbk)


def _offsets(cu: torch.Tensor, pad: int):
    """int32 (cu, cu_pad): each sequence's first token, and its first row in the padded layouts."""
    cu = cu.to(torch.int32)
    lens = cu[1:] - cu[:-1]
    cu_pad = torch.zeros_like(cu)
    cu_pad[1:] = torch.cumsum((lens + pad - 1) // pad * pad, 0)
    return cu, cu_pad


def window_offsets(causal: bool, window: Tuple[Optional[int], Optional[int]]) -> Tuple[int, int]:
    """(lo, hi): key j is visible from query i when ``lo <= j - i <= hi`` (unbounded: +-BIG)."""
    left, right = window
    lo = -BIG if left is None else -int(left)
    hi = BIG if right is None else int(right)
    return lo, (min(hi, 0) if causal else hi)


def _strides(x: torch.Tensor, varlen: bool):
    """(batch, head, token, dim) strides of a dense (B, H, S, D) or packed (T, H, D) tensor."""
    if varlen:
        return 0, x.stride(1), x.stride(0), x.stride(2)
    return x.stride(0), x.stride(1), x.stride(2), x.stride(3)


def _like(x: torch.Tensor, dim: int, dtype) -> torch.Tensor:
    """An output shaped as ``x`` but with last dim ``dim``, in ``x``'s memory order."""
    if x.dim() == 4 and x.stride(1) < x.stride(2):  # (B, S, H, D) memory behind a (B, H, S, D) view
        B, H, S, _ = x.shape
        return torch.empty((B, S, H, dim), dtype=dtype, device=x.device).transpose(1, 2)
    return torch.empty((*x.shape[:-1], dim), dtype=dtype, device=x.device)


def _ieee_rotation(x: torch.Tensor) -> bool:
    """Rotate in fp32 (``input_precision="ieee"``): fp32 inputs, and every input when interpreted
    (the interpreter's bf16 dot is wrong); else a bf16/fp16 tensor-core dot (+-1 entries, fp32 sums)."""
    return x.dtype == torch.float32 or interpreting()


def _padded_rotation(rotation, x: torch.Tensor, dp: int, dummy: torch.Tensor) -> torch.Tensor:
    """R padded to (DP, DP) with zeros, in x's dtype (+-1 is exact in every float dtype); ``dummy``
    without rotation."""
    if rotation is None:
        return dummy
    rot = torch.zeros((dp, dp), dtype=x.dtype, device=x.device)
    rot[:rotation.shape[0], :rotation.shape[1]] = rotation
    return rot


def _quantize(x, geo: _Geometry, heads: int, s: int, sp: int, nb: int, recipe: AttentionRecipe,
              tune: AttentionTuning, cu, cu_pad, *, rotation=None, natural=True, transposed=False, o=None):
    """(codes, transposed codes, scales, delta) of ``x`` (``quantize.quantize_kernel``)."""
    d = x.shape[-1]
    dp = padded_dim(d)
    dev = x.device
    codes = torch.empty((geo.z, heads, sp, dp), dtype=torch.uint8, device=dev) if natural else None
    codes_t = torch.empty((geo.z, heads, dp, sp), dtype=torch.uint8, device=dev) if transposed else None
    scales = torch.empty((geo.nseq, heads, nb), dtype=torch.float32, device=dev)
    delta = torch.empty((geo.z, heads, sp), dtype=torch.float32, device=dev) if o is not None else None
    dummy = scales
    rot = _padded_rotation(rotation, x, dp, dummy)
    unit = recipe.block or geo.pad
    dc = recipe.rotation_block(d) if rotation is not None else min(dp, 128)
    runnable(quantize_kernel)[(nb, geo.nseq, heads)](
        x, *_strides(x, geo.varlen), cu if cu is not None else dummy, cu_pad if cu_pad is not None else dummy, rot,
        codes if natural else dummy, codes_t if transposed else dummy, scales,
        o if o is not None else dummy, *(_strides(o, geo.varlen) if o is not None else (0, 0, 0, 0)),
        delta if o is not None else dummy, s, sp, heads, nb, d,
        BLOCK=recipe.block, PAD=geo.pad, CHUNK=min(tune.quant_chunk, unit), DC=dc, DP=dp,
        VARLEN=geo.varlen, ROTATE=rotation is not None, R_IEEE=_ieee_rotation(x), NATURAL=natural,
        TRANSPOSED=transposed, HAS_DELTA=o is not None, HW_CVT=0 if interpreting() else 1,
        num_warps=tune.quant_warps)
    view = lambda t: t.view(torch.float8_e4m3fn) if t is not None else None  # noqa: E731
    return view(codes), view(codes_t), scales, delta


def _desc(codes: torch.Tensor, rows: int, cols: int) -> TensorDescriptor:
    """A TMA descriptor over a padded array (codes, lse, delta) seen as 2-D (all but the last dim
    flattened)."""
    flat = codes.view(-1, codes.shape[-1])
    return TensorDescriptor(flat, list(flat.shape), [flat.shape[-1], 1], [rows, cols])


def _tma_ok(x: torch.Tensor) -> bool:
    """A TMA descriptor can read ``x`` in place: unit last stride, 16-byte aligned base and strides."""
    size = x.element_size()
    return x.stride(-1) == 1 and x.data_ptr() % 16 == 0 and all((st * size) % 16 == 0 for st in x.stride()[:-1])


def _input_desc(x: torch.Tensor, rows: int, dp: int, varlen: bool) -> Tuple[TensorDescriptor, int]:
    """(descriptor, layout) over the caller's tensor in its memory order (TMA wants the strides
    decreasing): blocks of ``rows`` tokens of one head by ``dp`` columns (past D: zeros). Layout 0:
    (B, H, S, D); 1: (B, S, H, D) memory behind a (B, H, S, D) view; 2: packed (T, H, D)."""
    if varlen:
        layout, view, block = 2, x, [rows, 1, dp]
    elif x.stride(1) < x.stride(2):
        layout, view, block = 1, x.transpose(1, 2), [1, rows, 1, dp]
    else:
        layout, view, block = 0, x, [1, 1, rows, dp]
    return TensorDescriptor(view, list(view.shape), list(view.stride()), block), layout


def triton_support(q: torch.Tensor) -> Optional[str]:
    """None when the kernels can run this call here, else why not."""
    if q.device.type != "cuda" and not interpreting():
        return f"the Triton attention kernels run on CUDA (or under TRITON_INTERPRET=1), not {q.device.type}"
    if q.device.type == "cuda" and capability(q.device) < (9, 0):
        return f"the kernels need sm_90+ (TMA, FP8 wgmma), this GPU is sm_{''.join(map(str, capability(q.device)))}"
    return None


def _setup(q, k, v, recipe, cu_seqlens, max_seqlen):
    if recipe.block and recipe.block < MIN_TILE and not interpreting():
        raise ValueError(f"AttentionRecipe(block={recipe.block}): the Triton kernels' tiles are clipped to the "
                         f"scale block and FP8 tensor-core products need tiles of >= {MIN_TILE}; use block >= "
                         f"{MIN_TILE} (or 0) or the torch backend")
    cu = cu_pad = None
    geo = _geometry(q, k, v, recipe, cu_seqlens, max_seqlen)
    if cu_seqlens is not None:
        cu, cu_pad = _offsets(cu_seqlens, geo.pad)
    return geo, cu, cu_pad, tuning_for(geo.dp, interpreting())


def attention_fwd(q, k, v, *, causal: bool, window, scale: float, recipe: AttentionRecipe,
                  cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None):
    """(out in q's dtype, lse (Z, Hq, SP) fp32 log2 units) of FP8 attention (``forward``)."""
    geo, cu, cu_pad, tune = _setup(q, k, v, recipe, cu_seqlens, max_seqlen)
    interp = interpreting()
    rot = recipe.rotation(geo.d, q.device)
    bm, bn = recipe.tiles(tune.fwd_block_m, tune.fwd_block_n)
    fuse_q = recipe.block in (bm, 2 * bm) and (rot is None or geo.dp <= 128) and _tma_ok(q)  # a tile: 1 or 1/2 block
    kc, _, sk, _ = _quantize(k, geo, geo.hkv, geo.s_k, geo.spk, geo.nbk, recipe, tune, cu, cu_pad, rotation=rot)
    _, vt, sv, _ = _quantize(v, geo, geo.hkv, geo.s_k, geo.spk, geo.nbk, recipe, tune, cu, cu_pad, natural=False,
                             transposed=True)
    k_desc = _desc(kc, bn, geo.dp)
    if fuse_q:  # the kernel reads q itself: q_desc and sq unused
        q_desc, sq = k_desc, sk
        x_desc, x_layout = _input_desc(q, bm, geo.dp, geo.varlen)
        rot = _padded_rotation(rot, q, geo.dp, None)
        r_desc = TensorDescriptor(rot, [geo.dp, geo.dp], [geo.dp, 1], [geo.dp, geo.dp]) if rot is not None else k_desc
    else:
        qc, _, sq, _ = _quantize(q, geo, geo.hq, geo.s_q, geo.spq, geo.nbq, recipe, tune, cu, cu_pad, rotation=rot)
        q_desc = x_desc = r_desc = _desc(qc, bm, geo.dp)
        x_layout = 0
    out = _like(q, geo.dv, torch.float32 if interp else q.dtype)
    lse = torch.empty((geo.z, geo.hq, geo.spq), dtype=torch.float32, device=q.device)
    lo, hi = window_offsets(causal, window)
    c = scale * LOG2E / recipe.rotation_block(geo.d)
    runnable(attention_fwd_kernel)[(cdiv(geo.s_q, bm), geo.hq, geo.nseq)](
        q_desc, k_desc, _desc(vt, geo.dvp, bn), x_desc, r_desc, sq, sk, sv, out, lse,
        cu if cu is not None else sq, cu_pad if cu_pad is not None else sq, *_strides(out, geo.varlen),
        geo.s_q, geo.s_k, geo.spq, geo.spk, geo.hq, geo.hkv, geo.nbq, geo.nbk, geo.d, geo.dv, c, lo, hi,
        DP=geo.dp, DVP=geo.dvp, BLOCK_M=bm, BLOCK_N=bn, SB=recipe.block, VARLEN=geo.varlen, FUSE_Q=fuse_q,
        X_LAYOUT=x_layout, ROTATE=fuse_q and rot is not None, R_IEEE=_ieee_rotation(q), INTERPRET=interp,
        num_warps=tune.fwd_warps, num_stages=tune.fwd_stages,
        **({} if tune.fwd_maxnreg is None or interp else dict(maxnreg=tune.fwd_maxnreg)))
    return (out.to(q.dtype) if interp else out), lse


def attention_bwd(dout, q, k, v, out, lse, *, causal: bool, window, scale: float, recipe: AttentionRecipe,
                  cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None):
    """(dq, dk, dv) in the inputs' dtypes and layouts (``backward``)."""
    geo, cu, cu_pad, tune = _setup(q, k, v, recipe, cu_seqlens, max_seqlen)
    interp = interpreting()
    rot = recipe.rotation(geo.d, q.device)
    args = (geo, geo.hq, geo.s_q, geo.spq, geo.nbq, recipe, tune, cu, cu_pad)
    kv_args = (geo, geo.hkv, geo.s_k, geo.spk, geo.nbk, recipe, tune, cu, cu_pad)
    qc, qt, sq, _ = _quantize(q, *args, rotation=rot, transposed=True)
    kc, kt, sk, _ = _quantize(k, *kv_args, rotation=rot, transposed=True)
    vc, _, sv, _ = _quantize(v, *kv_args)
    doc, dot, sdo, delta = _quantize(dout, *args, transposed=True, o=out)
    wide = interp or rot is not None  # fp32 results: rotated back (and rounded) by torch
    dq = _like(q, geo.d, torch.float32 if wide else q.dtype)
    dk = _like(k, geo.d, torch.float32 if wide else k.dtype)
    dv = _like(v, geo.dv, torch.float32 if interp else v.dtype)
    kn, km = recipe.tiles(tune.dkdv_block_n, tune.dkdv_block_m)  # dkdv: keys a program, queries a step
    qm, qn = recipe.tiles(tune.dq_block_m, tune.dq_block_n)  # dq: queries a program, keys a step
    lo, hi = window_offsets(causal, window)
    hb = recipe.rotation_block(geo.d)
    c, c_ln = scale * LOG2E / hb, scale / hb
    cu_, cu_pad_ = (cu, cu_pad) if cu is not None else (sq, sq)
    consts = dict(DP=geo.dp, DVP=geo.dvp, SB=recipe.block, VARLEN=geo.varlen, INTERPRET=interp)
    sizes = (geo.s_q, geo.s_k, geo.spq, geo.spk, geo.hq, geo.hkv, geo.nbq, geo.nbk, geo.d)
    runnable(attention_dkdv_kernel)[(cdiv(geo.s_k, kn), geo.hkv, geo.nseq)](
        _desc(qc, km, geo.dp), _desc(qt, geo.dp, km), _desc(kc, kn, geo.dp), _desc(vc, kn, geo.dvp),
        _desc(doc, km, geo.dvp), _desc(dot, geo.dvp, km), _desc(lse, 1, km), _desc(delta, 1, km), sq, sk, sv, sdo,
        dk, dv, cu_, cu_pad_,
        *_strides(dk, geo.varlen), *_strides(dv, geo.varlen), *sizes, geo.dv, c, c_ln, -hi, -lo,
        BLOCK_M=km, BLOCK_N=kn, **consts, num_warps=tune.dkdv_warps, num_stages=tune.dkdv_stages)
    runnable(attention_dq_kernel)[(cdiv(geo.s_q, qm), geo.hq, geo.nseq)](
        _desc(qc, qm, geo.dp), _desc(kc, qn, geo.dp), _desc(kt, geo.dp, qn), _desc(vc, qn, geo.dvp),
        _desc(doc, qm, geo.dvp), sq, sk, sv, sdo, lse, delta, dq, cu_, cu_pad_, *_strides(dq, geo.varlen), *sizes,
        c, c_ln, lo, hi, BLOCK_M=qm, BLOCK_N=qn, **consts, num_warps=tune.dq_warps, num_stages=tune.dq_stages)
    if rot is not None:
        dq, dk = dq @ rot.t(), dk @ rot.t()
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)

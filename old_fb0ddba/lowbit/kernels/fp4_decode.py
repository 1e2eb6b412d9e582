"""FP4 decode helpers shared by the FP4 GEMMs (``fp4_gemm``: FP4 x FP4; ``fp4_weight_only``: bf16 x FP4).

See ``fp4_gemm``'s docstring for the slot-major K order and the exactness of the decode. Three
PTX decodes of the same exact values (``_asm_body``; costs in ``fp4_weight_only``'s docstring):
DECODE 0 and 1 produce the same tensors (element j of every word), DECODE 2 another K order
within each pair of words, which ``_x_slots`` / ``_x_tile`` give the activations too. The
portable path (interpreter, fp16, not sm_90) computes the same values in fp32 for every DECODE.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .gemm import _e8m0_to_fp32

# ---- decoding --------------------------------------------------------------------------------------
@triton.jit
def _e2m1_to_fp32(c):
    """E2M1 code (0..15) -> fp32 value, exactly (bits built from the code)."""
    c = c.to(tl.int32)
    m = c & 7
    bits = tl.where(m >= 2, (m + 252) << 22, tl.where(m == 1, 0x3F000000, 0))  # 1.0 = 254 << 22
    return (bits | ((c & 8) << 28)).to(tl.float32, bitcast=True)


def _asm_byte(b: int) -> str:
    """PTX for byte ``b`` of the words ($8, $9): elements 2b (low nibble) and 2b+1 (high nibble)
    as bf16 pairs (one lane per word), ``e2m1 * 2^-126``, times ``c`` then the scale pair $10."""
    return (f"prmt.b32 d, $8, $9, {0x4400 + 0x1111 * b:#x};\n"  # word bytes b -> bits 8..15, 24..31
            "and.b32 x, d, 0x70007000; shr.b32 x, x, 6; and.b32 y, d, 0x80008000; or.b32 x, x, y;\n"
            f"mul.rn.bf16x2 x, x, c; mul.rn.bf16x2 ${2 * b + 1}, x, $10;\n"
            "shl.b32 d, d, 4;\n"
            "and.b32 x, d, 0x70007000; shr.b32 x, x, 6; and.b32 y, d, 0x80008000; or.b32 x, x, y;\n"
            f"mul.rn.bf16x2 x, x, c; mul.rn.bf16x2 ${2 * b}, x, $10;\n")


def _asm_pair(dst: int, src: str, iso: int, spread: int) -> str:
    """bf16x2 ``$dst`` from the two nibbles ``src & iso`` (one per 16-bit half, at bit 4t of the
    half): ``n * spread`` (``spread = 2^(6-4t) + 2^(12-4t)``) is two disjoint copies of each nibble,
    one with the sign at bit 15 and one with the magnitude ``eem`` at bits 8..6; the mask
    0x81C081C0 keeps exactly those: ``s.eem`` at bf16 bits 15 / 8..6 is ``e2m1 * 2^-126`` (codes
    0, 1 come out as the subnormals 0, 2^-127, code 8 as -0). Then times ``c`` and the scale $10."""
    return (f"and.b32 n, {src}, {iso:#x}; mul.lo.u32 n, n, {spread:#x}; and.b32 n, n, 0x81c081c0;\n"
            f"mul.rn.bf16x2 n, n, c; mul.rn.bf16x2 ${dst}, n, $10;\n")


def _asm_body(decode: int) -> str:
    """DECODE 0 (the first version): prmt + and/shr/and/or per pair. DECODE 1: the same outputs
    (output j = element j of word $8 / $9 in the low / high lane), prmt + and/mul/and per pair
    (fewer INT32-pipe instructions: the multiply runs on the FMA pipe). DECODE 2: output t (t < 4)
    = elements t / t + 4 of word $8, output 4 + t = elements t / t + 4 of word $9 (a different K
    order, matched by ``_x_tile``): no prmt, one shift per word."""
    if decode == 0:
        return "".join(_asm_byte(b) for b in range(4))
    if decode == 1:
        return "".join(f"prmt.b32 d, $8, $9, {0x4400 + 0x1111 * b:#x};\n"  # byte b of each word -> bytes 0, 2
                       + _asm_pair(2 * b, "d", 0x000F000F, 0x1040) + _asm_pair(2 * b + 1, "d", 0x00F000F0, 0x104)
                       for b in range(4))
    body = ""
    for base, word in ((0, "$8"), (4, "$9")):
        body += (f"shr.b32 d, {word}, 8;\n" + _asm_pair(base, word, 0x000F000F, 0x1040)
                 + _asm_pair(base + 1, word, 0x00F000F0, 0x104) + _asm_pair(base + 2, "d", 0x000F000F, 0x1040)
                 + _asm_pair(base + 3, "d", 0x00F000F0, 0x104))
    return body


def _asm(prescale: int, decode: int = 0) -> str:
    body = _asm_body(decode)
    if prescale == 0x3F803F80:  # x * 1.0: drop the multiply
        body = body.replace("mul.rn.bf16x2 x, x, c; ", "").replace("mul.rn.bf16x2 n, n, c; ", "")
    return "{\n.reg .b32 d, x, y, n, c;\n" + f"mov.b32 c, {prescale:#x};\n" + body + "}"


_ASM_NV = tl.constexpr(_asm(0x3F803F80))  # scale pre-multiplied by 2^118: result e2m1 * s * 2^-8
_ASM_MX = tl.constexpr(_asm(0x7E807E80))  # x 2^126 (exact), then x 2^k: result e2m1 * 2^k
_ASM_NV1 = tl.constexpr(_asm(0x3F803F80, 1))
_ASM_MX1 = tl.constexpr(_asm(0x7E807E80, 1))
_ASM_NV2 = tl.constexpr(_asm(0x3F803F80, 2))
_ASM_MX2 = tl.constexpr(_asm(0x7E807E80, 2))


@triton.jit
def _e2m1_times(w, SHIFT: tl.constexpr, s, DTYPE: tl.constexpr):
    return (_e2m1_to_fp32((w >> SHIFT) & 15) * s).to(DTYPE)


@triton.jit
def _decode_words(w, s, MX: tl.constexpr, ASM: tl.constexpr, DTYPE: tl.constexpr, PRE: tl.constexpr = False,
                  DECODE: tl.constexpr = 0):
    """8 tensors of ``w``'s shape (int32 words of 8 codes), element ``E_x`` of each word times the
    word's scale ``s`` (fp32; PRE, ASM only: already the bf16 operand, NV: UE4M3 * 2^118, MX: 2^k,
    converted once per block). DECODE 0 / 1: tensor x holds element x of each word. DECODE 2, within
    each pair of words (2v, 2v + 1), position 2v + p of tensor x holds element ``(x % 4) + 4 p`` of
    word ``2v + (x >= 4)`` (so the K order of ``_decode_cat`` changes: ``_x_tile`` matches it; the
    scales of a pair are equal: blocks are >= 16 elements). ASM (bf16, CUDA): NV values come out
    times 2^-8; DECODE picks the PTX (``_asm_body``), the portable path computes the same values."""
    if ASM:
        if PRE:
            s2 = s
        elif MX:
            s2 = s.to(tl.bfloat16)  # 2^k: exact in bf16
        else:
            s2 = (s * 3.3231458909047650e35).to(tl.bfloat16)  # UE4M3 * 2^118: exact
        if DECODE == 2:
            asm: tl.constexpr = _ASM_MX2 if MX else _ASM_NV2
        elif DECODE == 1:
            asm: tl.constexpr = _ASM_MX1 if MX else _ASM_NV1
        else:
            asm: tl.constexpr = _ASM_MX if MX else _ASM_NV
        return tl.inline_asm_elementwise(asm, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r", [w, s2],
                                         dtype=(tl.bfloat16,) * 8, is_pure=True, pack=2)
    elif DECODE == 2:
        R: tl.constexpr = w.shape[0]
        W: tl.constexpr = w.shape[1]
        a, b = tl.split(tl.reshape(w, (R, W // 2, 2)))
        sa, sb = tl.split(tl.reshape(s, (R, W // 2, 2)))
        return (tl.reshape(tl.join(_e2m1_times(a, 0, sa, DTYPE), _e2m1_times(a, 16, sa, DTYPE)), (R, W)),
                tl.reshape(tl.join(_e2m1_times(a, 4, sa, DTYPE), _e2m1_times(a, 20, sa, DTYPE)), (R, W)),
                tl.reshape(tl.join(_e2m1_times(a, 8, sa, DTYPE), _e2m1_times(a, 24, sa, DTYPE)), (R, W)),
                tl.reshape(tl.join(_e2m1_times(a, 12, sa, DTYPE), _e2m1_times(a, 28, sa, DTYPE)), (R, W)),
                tl.reshape(tl.join(_e2m1_times(b, 0, sb, DTYPE), _e2m1_times(b, 16, sb, DTYPE)), (R, W)),
                tl.reshape(tl.join(_e2m1_times(b, 4, sb, DTYPE), _e2m1_times(b, 20, sb, DTYPE)), (R, W)),
                tl.reshape(tl.join(_e2m1_times(b, 8, sb, DTYPE), _e2m1_times(b, 24, sb, DTYPE)), (R, W)),
                tl.reshape(tl.join(_e2m1_times(b, 12, sb, DTYPE), _e2m1_times(b, 28, sb, DTYPE)), (R, W)))
    else:
        return (_e2m1_times(w, 0, s, DTYPE), _e2m1_times(w, 4, s, DTYPE), _e2m1_times(w, 8, s, DTYPE),
                _e2m1_times(w, 12, s, DTYPE), _e2m1_times(w, 16, s, DTYPE), _e2m1_times(w, 20, s, DTYPE),
                _e2m1_times(w, 24, s, DTYPE), _e2m1_times(w, 28, s, DTYPE))


@triton.jit
def _scale_bytes(s_ptr, rows, stride_s, k0, K, WORDS: tl.constexpr, SBLOCK: tl.constexpr,
                 SROWS: tl.constexpr, EVEN_K: tl.constexpr):
    """Block-scale bytes ``(R, WORDS / (SBLOCK / 8))`` of ``rows`` for the K tile starting at ``k0``."""
    blk = k0 // SBLOCK + tl.arange(0, WORDS // (SBLOCK // 8))
    ptrs = s_ptr + (rows // SROWS)[:, None] * stride_s + blk[None, :]
    if EVEN_K:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=(blk < tl.cdiv(K, SBLOCK))[None, :], other=0)


@triton.jit
def _word_scales(s, WORDS: tl.constexpr, SBLOCK: tl.constexpr, MX: tl.constexpr):
    """Scale bytes (E8M0 or UE4M3) -> fp32, broadcast over each block's ``SBLOCK / 8`` words."""
    PER: tl.constexpr = SBLOCK // 8
    if MX:
        s = _e8m0_to_fp32(s)
    else:  # UE4M3 bytes
        s = s.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    return tl.reshape(tl.broadcast_to(s[:, :, None], (s.shape[0], WORDS // PER, PER)), (s.shape[0], WORDS))


@triton.jit
def _words(q_ptr, rows, stride_q, k0, K, WORDS: tl.constexpr, EVEN_K: tl.constexpr):
    """Packed words ``(R, WORDS)`` of ``rows`` from element ``k0`` (EVEN_K: the tile lies inside K,
    no masks, so the load is contiguous and the pipeliner makes it an asynchronous copy)."""
    wi = k0 // 8 + tl.arange(0, WORDS)
    if EVEN_K:
        return tl.load(q_ptr + rows[:, None] * stride_q + wi[None, :])
    else:
        return tl.load(q_ptr + rows[:, None] * stride_q + wi[None, :], mask=(wi < K // 8)[None, :], other=0)


@triton.jit
def _decode_cat(w, s, MX: tl.constexpr, ASM: tl.constexpr, DTYPE: tl.constexpr, R: tl.constexpr,
                WORDS: tl.constexpr, PRE: tl.constexpr = False, DECODE: tl.constexpr = 0):
    """Decoded words ``(R, WORDS)`` as one ``(R, 8 WORDS)`` operand in *slot-major* K order:
    column ``x WORDS + w`` holds tensor x of ``_decode_words`` at word w (DECODE 0 / 1: element
    ``8w + x``; DECODE 2: see ``_x_tile``). In the wgmma register layout this concatenation only
    renames registers (no shuffle, no shared memory: checked in the sm_90 TTGIR), so a K step is
    one ``tl.dot`` instead of 8 dots each waited for."""
    t0, t1, t2, t3, t4, t5, t6, t7 = _decode_words(w, s, MX, ASM, DTYPE, PRE, DECODE)
    t = tl.join(tl.join(tl.join(t0, t4), tl.join(t2, t6)), tl.join(tl.join(t1, t5), tl.join(t3, t7)))
    t = tl.reshape(t, (R, WORDS, 8))  # [r, w, 4a + 2b + c] = t_(4a+2b+c)[r, w]
    return tl.reshape(tl.permute(t, (0, 2, 1)), (R, 8 * WORDS))


@triton.jit
def _x_slots(x_ptr, xrows, stride_xm, k0, K, WORDS: tl.constexpr, EVEN_K: tl.constexpr,
             DOT_DTYPE: tl.constexpr, DECODE: tl.constexpr = 0):
    """``X[m-tile, k0 : k0 + 8 WORDS]`` as ``(BLOCK_M, WORDS, 8)``: ``[m, w, x]`` = element
    ``k0 + e(w, x)``, the element that slot x of word w of the decode multiplies. DECODE 0 / 1:
    ``e = 8w + x`` (one contiguous load). DECODE 2: ``e = 16 (w // 2) + 8 (x // 4) + 4 (w % 2) + x % 4``
    (the pointers gather runs of 4 elements, 8 bytes): the 16 elements of the words (2v, 2v + 1)
    with two index bits swapped. K is a multiple of 32, so a pair of words lies wholly inside K
    or past it (one mask per pair)."""
    wi = tl.arange(0, WORDS)
    j = tl.arange(0, 8)
    if DECODE == 2:
        wk = 16 * (wi // 2) + 4 * (wi % 2)
        jk = 8 * (j // 4) + j % 4
        inside = k0 + 16 * (wi // 2) < K
    else:
        wk = 8 * wi
        jk = j
        inside = k0 + 8 * wi < K
    ptrs = x_ptr + xrows[:, None, None] * stride_xm + (k0 + wk)[None, :, None] + jk[None, None, :]
    if EVEN_K:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=inside[None, :, None], other=0.0)
    return x.to(DOT_DTYPE)


@triton.jit
def _x_tile(x_ptr, xrows, stride_xm, k0, K, WORDS: tl.constexpr, BLOCK_M: tl.constexpr,
            EVEN_K: tl.constexpr, DOT_DTYPE: tl.constexpr, DECODE: tl.constexpr = 0):
    """``_x_slots`` in the K order of ``_decode_cat``: column ``x WORDS + w`` = ``[m, w, x]``."""
    x = _x_slots(x_ptr, xrows, stride_xm, k0, K, WORDS, EVEN_K, DOT_DTYPE, DECODE)
    return tl.reshape(tl.permute(x, (0, 2, 1)), (BLOCK_M, 8 * WORDS))


@triton.jit
def _split8(x):
    """``(A, B, 8)`` -> the 8 tensors ``x[:, :, j]`` (splits of size-2 dimensions)."""
    A: tl.constexpr = x.shape[0]
    B: tl.constexpr = x.shape[1]
    e, o = tl.split(tl.reshape(x, (A, B, 4, 2)))  # j = 2a + b: b = 0 / 1
    e0, e1 = tl.split(tl.reshape(e, (A, B, 2, 2)))  # a = 2c + d: d = 0 / 1
    o0, o1 = tl.split(tl.reshape(o, (A, B, 2, 2)))
    x0, x4 = tl.split(e0)
    x2, x6 = tl.split(e1)
    x1, x5 = tl.split(o0)
    x3, x7 = tl.split(o1)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _cat4(t0, t1, t2, t3):
    """Four decoded slots ``(R, WORDS)`` as one ``(R, 4 WORDS)`` operand, slot-major (column
    ``x WORDS + w`` = ``t_x[:, w]``): half of ``_decode_cat``, the same register renaming."""
    R: tl.constexpr = t0.shape[0]
    W: tl.constexpr = t0.shape[1]
    t = tl.reshape(tl.join(tl.join(t0, t2), tl.join(t1, t3)), (R, W, 4))  # [r, w, 2c + b] = t_(2c+b)
    return tl.reshape(tl.permute(t, (0, 2, 1)), (R, 4 * W))


@triton.jit
def _x_halves(x_ptr, xrows, stride_xm, k0, K, WORDS: tl.constexpr, BLOCK_M: tl.constexpr,
              EVEN_K: tl.constexpr, DOT_DTYPE: tl.constexpr, DECODE: tl.constexpr = 0):
    """``_x_slots`` split by slot (0-3, 4-7), each in the K order of ``_cat4``."""
    x = _x_slots(x_ptr, xrows, stride_xm, k0, K, WORDS, EVEN_K, DOT_DTYPE, DECODE)
    xa, xb = tl.split(tl.permute(tl.reshape(x, (BLOCK_M, WORDS, 2, 4)), (0, 1, 3, 2)))  # slot 4h + i -> [.., i, h]
    return (tl.reshape(tl.permute(xa, (0, 2, 1)), (BLOCK_M, 4 * WORDS)),
            tl.reshape(tl.permute(xb, (0, 2, 1)), (BLOCK_M, 4 * WORDS)))

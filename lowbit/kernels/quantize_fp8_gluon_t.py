"""1x128 blocks with the transposed copy (128x1 blocks of x) from ONE read of x, in Gluon (sm_90).

Math: the split casts' (``quantize_fp8_rowblock_kernels`` + ``quantize_fp8_cols_t_kernels``), bit
for bit: ``q = fp8(x / s_row)`` with ``s_row = amax / fmax`` of the element's 1x128 row block,
``qt = fp8(x / s_col).t()`` with ``s_col`` of its 128x1 column block (IEEE ``amax / fmax``; 1 when
amax is 0 or the quotient is 0 / not finite; amax of the finite ``|x|``). A tile whose every |x| is
finite takes ``_codes_finite`` (``min(|RN(x / s)|, fmax)`` with x's sign, one satfinite cvt: valid
because ``|x| <= amax`` of the block, ``quantize_fp8_transpose_kernels``' docstring); a tile holding
NaN or inf takes the plain encode (``_codes_plain``: NaN -> 0x7F | sign, the clamp).

Why Gluon. A program owns a 128x128 tile of x: exactly one row block of each of its 128 rows and
one column block of each of its 128 columns, so both copies come from the tile held in registers
(HBM: x read once, 2 + 1 + 1 bytes an element). What plain Triton could not do (benchmarks/
RESULTS.md, session 8: 255 registers, or the codes' transposition through shared memory) is the
layout: here a thread holds an 8x8 block (``TILE``: 8 consecutive rows of 8 consecutive columns),
so

* x's loads and q's stores are 16- / 8-byte runs along a row (16 threads cover a 128-column row);
* qt's stores are 8-byte runs along a column of x (qt's row): the same registers seen through a
  layout with the other register order (``TILE_T``; converting between the two moves no data);
* a thread needs the division parts of 8 row scales and 8 column scales (48 registers), not of
  every column of the tile;
* the row amax is a max over 8 registers and 16 lanes, the column amax over 8 registers, 2 lanes
  and the 8 warps (through shared memory).

8 warps, a tile a program (one wave holds ~2 programs an SM); scales as the split casts store
them: ``s[r, c // 128]`` (R, ceil(C / 128)) and ``st[c, r // 128]`` (C, ceil(R / 128)). Edges:
loads past R / C read 0 (no effect on an amax), stores are masked.
"""
from __future__ import annotations

import torch

from .gemm_gluon import gl  # None without Gluon
from .quantize_fp8_transpose_kernels import _codes_finite, _codes_plain, _sign
from .quantize_jit_helpers import _amax_to_scale, _div_parts

__all__ = ["gluon_block_t_support", "cast_1x128_t_gluon", "compile_for_sm90"]

BLOCK = 128
WARPS = 8
STAGES = 3  # x tiles in flight a program (3 x 32 KB of shared memory)

if gl is not None:
    import triton.language as tl
    from triton.experimental import gluon
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

    from .gemm_gluon import _cta_barrier, _tma_load

    @gluon.jit
    def _max_nan(a, b):
        """NaN-propagating max (``max.NaN.f32``): a NaN in a block reaches its amax."""
        return gl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)

    @gluon.jit
    def _codes(x, p2k, sp, ys, FINITE: gl.constexpr, FMAX: gl.constexpr, EMIN: gl.constexpr,
               MBITS: gl.constexpr, IS_E4M3: gl.constexpr, HW_CVT: gl.constexpr):
        if FINITE:
            c = _codes_finite(x, _sign(x), p2k, -sp, ys, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT)
        else:
            c = _codes_plain(x, p2k, sp, ys, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT)
        return c

    @gluon.jit
    def _both_copies(x, amax_row, amax_col, rows, cols, rows_t, cols_t, R, C, q_ptr, sqr, s_ptr, qt_ptr, st_ptr,
                     n_sc, n_stc, bi, bj, TILE_T: gl.constexpr, FINITE: gl.constexpr, FMAX: gl.constexpr,
                     EMIN: gl.constexpr, MBITS: gl.constexpr, IS_E4M3: gl.constexpr, HW_CVT: gl.constexpr):
        """Scales, codes and stores of both copies of one tile from the amaxes of its rows and
        columns (``FINITE``: every |x| finite)."""
        s_row = _amax_to_scale(amax_row, FMAX)  # (128,): the tile's rows
        s_col = _amax_to_scale(amax_col, FMAX)  # (128,): the tile's columns
        gl.store(s_ptr + rows.to(gl.int64) * n_sc + bj, s_row, mask=rows < R)
        gl.store(st_ptr + cols.to(gl.int64) * n_stc + bi, s_col, mask=cols < C)
        rmask = gl.expand_dims(rows < R, 1) & gl.expand_dims(cols < C, 0)
        p2k, sp, ys = _div_parts(s_row, True)
        q = _codes(x, gl.expand_dims(p2k, 1), gl.expand_dims(sp, 1), gl.expand_dims(ys, 1), FINITE, FMAX,
                   EMIN, MBITS, IS_E4M3, HW_CVT)
        gl.store(q_ptr + gl.expand_dims(rows.to(gl.int64) * sqr, 1) + gl.expand_dims(cols, 0), q, mask=rmask)
        p2k, sp, ys = _div_parts(s_col, True)
        qt = _codes(x, gl.expand_dims(p2k, 0), gl.expand_dims(sp, 0), gl.expand_dims(ys, 0), FINITE, FMAX,
                    EMIN, MBITS, IS_E4M3, HW_CVT)
        qt = gl.convert_layout(qt, TILE_T)  # the same registers, column-major order: no data moves
        tmask = gl.expand_dims(rows_t < R, 1) & gl.expand_dims(cols_t < C, 0)
        gl.store(qt_ptr + gl.expand_dims(cols_t.to(gl.int64) * R, 0) + gl.expand_dims(rows_t, 1), qt, mask=tmask)

    @gluon.jit
    def _issue(x_desc, bufs, ready, k, t, n_tiles, n_tc, STAGES: gl.constexpr):
        """TMA load of tile ``t`` (if it exists) into ring slot ``k % STAGES``."""
        slot = k % STAGES
        pred = t < n_tiles
        mbarrier.expect(ready.index(slot), 128 * 128 * 2, pred)
        _tma_load(x_desc, [(t // n_tc) * 128, (t % n_tc) * 128], ready.index(slot), bufs.index(slot), pred)

    @gluon.jit
    def _cast_1x128_t_kernel(x_desc, q_ptr, s_ptr, qt_ptr, st_ptr, R, C, sqr, n_sc, n_stc,
                             FMAX: gl.constexpr, EMIN: gl.constexpr, MBITS: gl.constexpr, IS_E4M3: gl.constexpr,
                             HW_CVT: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
        """Persistent: the program's tiles ``pid, pid + G, ..`` arrive by TMA in a ring of STAGES
        slots, STAGES tiles ahead of the one being cast (module docstring)."""
        gl.static_assert(num_warps == 8, "an 8x8 block a thread covers 128x128 with 8 warps")
        TILE: gl.constexpr = gl.BlockedLayout([8, 8], [2, 16], [8, 1], [1, 0])
        TILE_T: gl.constexpr = gl.BlockedLayout([8, 8], [2, 16], [8, 1], [0, 1])
        bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, 128, 128], x_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
        n_tc = gl.cdiv(C, 128)
        n_tiles = gl.cdiv(R, 128) * n_tc
        pid = gl.program_id(0)
        G = gl.num_programs(0)
        for i in gl.static_range(STAGES):
            _issue(x_desc, bufs, ready, i, pid + i * G, n_tiles, n_tc, STAGES)
        k = 0
        for t in range(pid, n_tiles, G):
            slot = k % STAGES
            mbarrier.wait(ready.index(slot), (k // STAGES) & 1)
            xb = bufs.index(slot).load(TILE)
            _cta_barrier()  # every warp has its registers of the slot before it is refilled
            fence_async_shared()
            _issue(x_desc, bufs, ready, k, t + STAGES * G, n_tiles, n_tc, STAGES)
            bi = t // n_tc
            bj = t % n_tc
            rows = bi * 128 + gl.arange(0, 128, layout=gl.SliceLayout(1, TILE))
            cols = bj * 128 + gl.arange(0, 128, layout=gl.SliceLayout(0, TILE))
            rows_t = bi * 128 + gl.arange(0, 128, layout=gl.SliceLayout(1, TILE_T))
            cols_t = bj * 128 + gl.arange(0, 128, layout=gl.SliceLayout(0, TILE_T))
            x = xb.to(gl.float32)  # exact; past R / C: TMA's zero fill
            ax = gl.abs(x)
            amax_row = gl.reduce(ax, 1, _max_nan)  # NaN-propagating: the finite test from the amaxes
            amax_col = gl.reduce(ax, 0, _max_nan)
            if gl.reduce(amax_row, 0, _max_nan) < float("inf"):
                _both_copies(x, amax_row, amax_col, rows, cols, rows_t, cols_t, R, C, q_ptr, sqr, s_ptr, qt_ptr,
                             st_ptr, n_sc, n_stc, bi, bj, TILE_T, True, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT)
            else:  # rare: NaN or inf in the tile; the amaxes of the finite |x|
                fin = gl.where(ax < float("inf"), ax, 0.0)
                _both_copies(x, gl.max(fin, axis=1), gl.max(fin, axis=0), rows, cols, rows_t, cols_t, R, C, q_ptr,
                             sqr, s_ptr, qt_ptr, st_ptr, n_sc, n_stc, bi, bj, TILE_T, False, FMAX, EMIN, MBITS,
                             IS_E4M3, HW_CVT)
            k += 1
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i))
else:  # pragma: no cover
    _cast_1x128_t_kernel = None


def gluon_block_t_support(x2: torch.Tensor, q2: torch.Tensor, bc: int) -> bool:
    """This kernel takes the cast: Gluon present, an sm_90 GPU, 1x128 blocks, bf16 x with unit
    column stride and 16-byte aligned rows (TMA), q with unit column stride."""
    if _cast_1x128_t_kernel is None or bc != BLOCK or x2.dtype != torch.bfloat16 or x2.device.type != "cuda":
        return False
    from .cuda_device import capability
    from .interpret import interpreting
    return (not interpreting() and capability(x2.device) == (9, 0) and x2.stride(1) == 1 and q2.stride(1) == 1
            and x2.stride(0) % 8 == 0 and x2.data_ptr() % 16 == 0 and x2.numel() < 2 ** 31)


def _x_layout():
    return gl.NVMMASharedLayout.get_default_for([BLOCK, BLOCK], gl.bfloat16)


def cast_1x128_t_gluon(x2, q2, qt, scale, st, fmt_args: dict) -> None:
    """Launch over x2 (R, C): q2 (R, C), qt (C, R) contiguous, scale (R, ceil(C/128)), st (C, ceil(R/128))."""
    from .cuda_device import sm_count
    from .gemm_gluon import _GluonDesc
    R, C = x2.shape
    x_desc = _GluonDesc(x2, [R, C], [x2.stride(0), 1], [BLOCK, BLOCK], _x_layout())
    tiles = -(-R // BLOCK) * -(-C // BLOCK)
    _cast_1x128_t_kernel[(min(tiles, sm_count(x2.device)),)](
        x_desc, q2, scale, qt, st, R, C, q2.stride(0), scale.shape[1], st.shape[1], **fmt_args, STAGES=STAGES,
        num_warps=WARPS)


def compile_for_sm90(is_e4m3: bool = True, hw_cvt: int = 2):
    """``triton.compile`` of the kernel for sm_90a on the CPU (tests, SASS inspection)."""
    import triton
    from triton.backends.compiler import GPUTarget
    try:
        from triton.experimental.gluon import GluonASTSource
    except ImportError:  # pragma: no cover - triton 3.6
        from triton.experimental.gluon._runtime import GluonASTSource
    sig = {"x_desc": f"tensordesc<bf16[{BLOCK},{BLOCK}],{_x_layout()!r}>", "q_ptr": "*u8", "s_ptr": "*fp32",
           "qt_ptr": "*u8", "st_ptr": "*fp32", "R": "i32", "C": "i32", "sqr": "i32", "n_sc": "i32", "n_stc": "i32"}
    fmt = dict(FMAX=448.0, EMIN=-6, MBITS=3, IS_E4M3=True) if is_e4m3 else dict(FMAX=57344.0, EMIN=-14, MBITS=2,
                                                                                 IS_E4M3=False)
    consts = dict(fmt, HW_CVT=hw_cvt, STAGES=STAGES, num_warps=WARPS)
    for k in consts:
        sig[k] = "constexpr"
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(sig)
             if name in ("q_ptr", "s_ptr", "qt_ptr", "st_ptr", "R", "C", "sqr")}
    return triton.compile(GluonASTSource(_cast_1x128_t_kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": WARPS, "enable_fp_fusion": False})

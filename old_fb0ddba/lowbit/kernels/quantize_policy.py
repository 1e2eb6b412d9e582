"""Launch policy of the fused quantize kernels (``lowbit.kernels.quantize``): every choice the
launchers make that changes no bit of any result, one function each.

The launchers call these at every launch, through this module, so ``benchmarks/quantize.py
--sweep`` (and ``benchmarks/quantize_sass.py``, the static sm_90 profile) can replace one function
at a time, check the result bit-exact on the GPU and time it. The defaults are the choices timed
on the H200; the levers that are off are off until a sweep has shown them exact and faster there:

* element arithmetic: ``fast_div`` (the exact reciprocal division rather than ``div.rn.f32``),
  ``blocks_fast_div``, ``lean_cast`` (the float8 code built from magnitude and sign apart,
  ``quantize_jit_helpers._encode_fp8_lean``), ``cvt_saturates`` / ``cvt_handles_nan`` (what is left
  to ``cvt.rn.satfinite``), through ``hw_cvt``;
* geometry of the streaming casts (tensorwise flat walks, their amax kernel, one-pass rowwise):
  ``stream_elems`` (elements of a tile), ``stream_warps``, ``stream_programs_per_sm`` (grid-stride
  programs), ``stream_prefetch`` (the next tile's load issued before this tile is computed);
  elements per thread = ``stream_elems / (32 * stream_warps)``: 8 is one 16-byte load and one
  8-byte store a thread, 16 two 16-byte loads and one 16-byte store;
* the tensorwise casts with the transposed copy: ``transpose_one_read`` (which kernel),
  ``transpose_one_read_tile``, ``transpose_one_read_warps``, ``transpose_one_read_maxnreg``; the
  grid-stride one's ``transpose_tile``, ``transpose_warps``, ``transpose_prefetch``; the rowwise,
  1xBC- and BxB-block ones (``quantize_fp8_transpose_kernels``, ``quantize_fp8_rowwise_t_kernels``,
  ``quantize_fp8_cols_t_kernels``): ``block_t_split``, ``rowwise_t_split``, ``rowwise_t_tiles``,
  ``block_t_tiles``, ``square_t_kernel`` (which kernels), ``cols_t_cols``, ``cols_t_rows``,
  ``cols_t_warps``, ``cols_t_slice_rows``, ``cols_t_maxnreg``, ``cols_t_reverse``, ``block_t_tile``,
  ``block_t_sweep_rows``, ``block_t_sweep_prefetch``, ``rowwise_t_sweep_rows``,
  ``rowwise_t_amax_tile``, ``t_sweep_warps``;
* the row-local walk of the casts without a transposed copy (``quantize_fp8_rowblock_kernels``:
  rowwise, 1x128, MX 1x32): ``rowlocal_rows``, ``rowlocal_blocks`` (which kernels),
  ``rowlocal_max_cols``, ``rowlocal_elems``, ``rowlocal_warps``, ``rowlocal_prefetch``,
  ``rowlocal_finite_tiles``, ``rowlocal_maxnreg``, ``rowlocal_programs_per_sm``, ``rowlocal_fast_div``;
  MX-FP4 1x32 the same way: ``rowlocal_fp4``, ``rowlocal_fp4_prefetch``, ``rowlocal_fp4_finite``;
  NV-FP4 1x16 ``rowlocal_nvfp4``; both on element pairs (``quantize_fp4_pairs_kernels``):
  ``rowlocal_fp4_pairs``, ``fp4_ptx_encode``;
* the other kernels: ``tile_elems``, ``opts``, ``max_programs``, ``block_chunks``;
* launches: ``delayed_amax_slots`` / ``current_amax_slots``: the amax kernels write one slot a
  program (read and reduced by the next kernel, ``amax_reduce_block`` at a time) instead of an
  atomic max into a zero-filled scalar, so no zero-fill launch.

Nothing here is read from the environment, and nothing is cached here (the device properties are, in
``cuda_device``).
"""
from __future__ import annotations

from . import quantize_fp8_tensor_row_kernels as _k8t
from .cuda_device import gpu
from .quantize_policy_t import (  # noqa: F401 - re-exported: the casts with a transposed copy
    block_t_split, block_t_sweep_prefetch, block_t_sweep_rows, block_t_tile,
    block_t_tiles, cols_t_cols, cols_t_maxnreg, cols_t_reverse, cols_t_rows, cols_t_slice_rows, cols_t_warps,
    rowwise_t_amax_tile, rowwise_t_split, rowwise_t_sweep_rows, rowwise_t_tiles, square_t_kernel, square_t_one_read,
    square_t_one_read_maxnreg, square_t_one_read_warps, t_sweep_warps, transpose_maxnreg, transpose_one_read,
    transpose_one_read_maxnreg, transpose_one_read_tile, transpose_one_read_warps, transpose_prefetch,
    transpose_tile, transpose_warps)

# ---- the machine ----------------------------------------------------------------------------------

def interpreted() -> bool:
    """The kernels, and triton's own jit helpers (``tl.max``), were defined under TRITON_INTERPRET=1:
    ``@triton.jit`` decides when it runs, so this cannot be switched later."""
    import triton.language as tl
    from triton.runtime.jit import JITFunction
    return type(_k8t._cast_tensor_kernel).__name__ == "InterpretedFunction" and not isinstance(tl.max, JITFunction)


def sms(x) -> int:
    """SMs of x's CUDA device."""
    return gpu(x.device.index or 0)[1]


# ---- element arithmetic -----------------------------------------------------------------------------

def fast_div() -> bool:
    """Per-element IEEE division by the two-step reciprocal (``quantize_jit_helpers._div_rn``)
    rather than ``div.rn.f32``; both are exact."""
    return True


def blocks_fast_div() -> bool:
    """The block kernel divides by ``div.rn.f32`` per element, not by ``fast_div``'s reciprocal:
    the fast division's straight-line fma chains raise the 16-warp 1x128 kernel on sm_90 from 32 to
    48 registers a thread (63 -> 102 with the transposed copy; triton 3.6), i.e. from 4 to 2 (2 to 1)
    resident programs per SM; tests/kernels/test_quantize_kernels.py checks the launched counts."""
    return False


def lean_cast() -> bool:
    """The lean float8 encode (``_encode_fp8_lean``: ``code(min(|y|, fmax)) | sign``, and the fast
    division without its sign fix-up): the same bits with fewer instructions: the delayed cast as
    launched on an H200 (sm_90, triton 3.6) has 25.6 SASS instructions an element in its loop,
    20.9 with this, 15.4 with ``cvt_handles_nan`` too (benchmarks/quantize_sass.py). On: the
    2026-12-01 H200 sweep (session 4) saw every FP8 cast bit-exact with it but the rowwise cast with
    its transposed copy (which ``quantize._fp8_rowwise`` keeps on the plain encode), and the delayed
    cast at 0.0575 ms instead of 0.0845 (8192x8192 bf16, kernel time)."""
    return True


def cvt_saturates() -> bool:
    """Leave the saturation to ``cvt.rn.satfinite`` (no clamp before it): benchmarks/quantize.py
    --sweep checks it bit-exact on the GPU and times it; off until that is seen. (The lean encode
    clamps either way: its clamp is the one ``max`` that also takes the absolute value.)"""
    return False


def cvt_handles_nan() -> bool:
    """With ``lean_cast``: leave NaN to ``cvt.rn.satfinite`` too (its code for a positive NaN,
    0x7F on the H200 for E4M3; no per-element NaN test): the sweep checks it on NaN inputs. On:
    bit-exact on the H200 for E4M3 and E5M2 (2026-12-01, session 4, NaN / -NaN payloads planted)."""
    return True


def hw_cvt(x) -> int:
    """``_encode_fp8``'s HW_CVT: the sm_89+ ``cvt.rn.satfinite`` float8 cast (exact RNE) on the GPU,
    after a clamp (1), alone (2, ``cvt_saturates``), or also for NaN (3, ``cvt_handles_nan``: read by
    the lean encode only); the arithmetic elsewhere (0)."""
    if x.device.type == "cuda" and not interpreted() and gpu(x.device.index or 0)[0] >= (8, 9):
        return 3 if cvt_handles_nan() else 2 if cvt_saturates() else 1
    return 0


# ---- geometry -----------------------------------------------------------------------------------------

def tile_elems(x) -> int:
    """Elements per tile: 4096 on the GPU; 16384 under the interpreter, whose cost is per operation."""
    return 16384 if interpreted() else 4096


def opts(elems: int) -> dict:
    """Launch options: no FP contraction (every op rounds as torch's does); ~8 elements per thread
    (4 to 16 warps), which keeps these kernels near 64 registers and the SMs full of warps."""
    return dict(enable_fp_fusion=False, num_warps=min(16, max(4, elems // 256)))


def max_programs(x, elems: int, num_warps=None) -> int:
    """Programs of the grid-stride kernels (one atomic each): 256 warps' worth per SM, i.e. several
    waves of resident programs (16-warp programs of these kernels take 24-40 registers a thread
    on sm_90: 3-4 resident per SM). Waves keep the SMs evenly loaded whatever the occupancy turns
    out to be (one wave of exactly the resident count would leave a second, partial wave if a
    compiler used a few more registers); each program still loops over several tiles, so the
    atomics stay few (16 per SM)."""
    if x.device.type == "cuda":
        return sms(x) * max(1, 256 // (num_warps or opts(elems)["num_warps"]))
    return 3  # the interpreter: a few programs, so the grid-stride loops run more than once


def stream_elems(x) -> int:
    """Elements of one tile of the streaming casts (tensorwise flat walk and its amax kernel;
    one-pass rowwise: a chunk of rows): ``tile_elems``."""
    return tile_elems(x)


def stream_warps(elems: int) -> int:
    """Warps of the tensorwise flat walks: half of ``opts``' (16 elements a thread: two 16-byte
    loads, one 16-byte store); on the H200 the delayed cast took 0.0542 ms with 8 warps against
    0.0575 with 16 (4096-element tiles, lean encode; 88% / 83% of copy, kernel time)."""
    return max(4, opts(elems)["num_warps"] // 2)


def rows_warps(elems: int) -> int:
    """Warps of the one-pass rowwise cast: ``opts``' (8 elements a thread); the H200 sweep timed
    16/thread slower for it (0.0826 against 0.0724 ms, 8192x8192)."""
    return opts(elems)["num_warps"]


def stream_programs_per_sm(num_warps: int) -> int:
    """Grid-stride programs of the flat walks per SM: 256 warps' worth (``max_programs``)."""
    return max(1, 256 // num_warps)


def _grid_programs(x, per_sm: int) -> int:
    """Programs of a grid-stride walk: ``per_sm`` per SM on the GPU; 3 under the interpreter (the
    loops run more than once)."""
    return sms(x) * per_sm if x.device.type == "cuda" else 3


def stream_programs(x, num_warps: int) -> int:
    """Grid-stride programs of the flat walks: ``stream_programs_per_sm`` per SM on the GPU; 3
    under the interpreter (the loops run more than once)."""
    return _grid_programs(x, stream_programs_per_sm(num_warps))


def stream_prefetch() -> bool:
    """The flat walks load tile t + programs before computing tile t (two tiles in flight a thread)."""
    return False


def block_chunks() -> int:
    """Chunks a block-cast program works through when no block is taller than a chunk (1x128, MX
    1x32, 1x128 with no transposed copy): more than one spreads the program's fixed cost (tile
    index division, scale-store set-up) over several chunks. On 2026-12-01 (H200, eager timing)
    4 gave MX-FP8 1x32 0.0975 ms and block 1x128 0.122 ms, bit-exact; in session 4 with the lean
    encode, 0.0732 / 0.0987 ms against 0.0918 / 0.105 with one chunk (kernel time)."""
    return 4


# ---- the row-local casts without a transposed copy (quantize_fp8_rowblock_kernels) ----------------

def rowlocal_rows() -> bool:
    """Rowwise without the transposed copy by the row-local walk (``_cast_rowblock_kernel``: a row
    held whole by one program, loaded once, its max through shared memory, grid-stride with
    ``rowlocal_prefetch``) instead of ``_cast_rows_kernel`` (two loops over a 4-row block, the
    second from L2); rows longer than ``rowlocal_max_cols`` keep ``_cast_rows_kernel``. H200
    (2026-12-01, session 7, 16384x4096 bf16, kernel time, bit-exact there): 0.0533 ms = 89.3% of
    copy against 0.0765 (62.2%); without prefetch 0.0588, without the finite-tile path 0.0635,
    ``div.rn`` 0.0626, 8192-element tiles 0.0659, 10 programs an SM 0.0526 (noise-sized)."""
    return True


def rowlocal_blocks() -> bool:
    """1xBC blocks without the transposed copy (Blockwise 1x128, MX 1x32; BC >= 16) by the
    row-local walk (a block in a few lanes of one warp: its max by shuffles, no shared memory)
    instead of ``_cast_blocks_kernel``. H200 (2026-12-01, session 7, 16384x4096 bf16, kernel
    time, bit-exact there): 1x128 0.0568 ms = 84.7% of copy against 0.0974 (49.4%), MX-FP8 1x32
    0.0508 = 94.6% against 0.0726 (66.2%); no prefetch 0.0619 / 0.0545, no finite-tile path
    0.0644 / 0.0490, ``div.rn`` 0.0667 / 0.0505, 1-4 warp programs 0.059-0.061 / 0.049-0.050."""
    return True


def rowlocal_max_cols() -> int:
    """Longest row (next power of two of C) the row-local rowwise cast holds in one tile: 8192
    (16 elements a thread at 16 warps, ``rowlocal_warps``)."""
    return 8192


def rowlocal_elems(x) -> int:
    """Elements of a row-local tile (at least one group): ``tile_elems``."""
    return tile_elems(x)


def rowlocal_warps(elems: int) -> int:
    """Warps of a row-local tile: 16 elements a thread (two 16-byte loads of bf16, one 16-byte
    store of codes), 1 to 16 warps: 8 at 4096 elements."""
    return min(16, max(1, elems // 512))


def rowlocal_prefetch() -> bool:
    """The row-local walk loads tile t + programs before reducing and casting tile t."""
    return True


def rowlocal_programs_per_sm(num_warps: int) -> int:
    """Grid-stride programs of the row-local walk per SM: 256 warps' worth, as the flat walks."""
    return max(1, 256 // num_warps)


def rowlocal_finite_tiles() -> bool:
    """A row-local tile whose every element is finite (seen from the integer max of the
    sign-cleared bits, which the group max needs anyway; one reduction across the program) takes
    the amax from those bits and the finite encode (``min(|x / s|, fmax)`` with x's sign, no NaN
    or inf handling, as the transpose sweeps' ``_codes_finite``); other tiles the general one.
    sm_90 (triton 3.6, 16384x4096 bf16, 8 warps, prefetch, 48 registers): SASS instructions an
    element on the finite path 18.9 (rowwise), 20.2 (1x128), 12.1 (MX 1x32), against 22-23, 21.8
    and 13.6 for the general encode alone."""
    return True


def rowlocal_maxnreg(num_warps: int):
    """Registers a thread at most of the row-local kernel (the ``maxnreg`` launch option; None:
    the compiler's choice): 48, i.e. 5 resident 8-warp programs an SM instead of 4. The rare
    non-finite path (``rowlocal_finite_tiles``) and the prefetched tile take the kernel to 63-64
    registers; capped at 48 the three casts spill nothing (sm_90, triton 3.6, 16384x4096 bf16,
    benchmarks/quantize_sass.py); at 40, prefetch on, they spill (16 bytes)."""
    return 48


def rowlocal_programs(x, num_warps: int) -> int:
    """Grid-stride programs of the row-local walk: ``rowlocal_programs_per_sm`` per SM on the GPU;
    3 under the interpreter (the loops run more than once)."""
    return _grid_programs(x, rowlocal_programs_per_sm(num_warps))


def rowlocal_fast_div() -> bool:
    """The row-local rowwise / 1x128 casts divide by ``_div_rn``'s exact reciprocal (lean path
    with ``lean_cast``) rather than ``div.rn.f32`` per element: at 8 warps the registers allow it
    (``blocks_fast_div`` is off for the 16-warp block kernel for its registers)."""
    return True


def rowlocal_fp4() -> bool:
    """MX E2M1 with 1xBC blocks (BC >= 16) and no Hadamard transform by the row-local walk
    (``quantize_fp4_kernels._mx_fp4_rowblock_kernel``, the ``rowlocal_*`` geometry)
    instead of ``_fp4_cast_kernel``. H200 (2026-12-01, session 7, 16384x4096 bf16, kernel time,
    bit-exact there): 0.0820 ms = 48.1% of copy without prefetch (``rowlocal_fp4_prefetch``
    off, as now) against 0.118 (33.6%); with prefetch 0.0888, one-warp programs 0.0851."""
    return True


def rowlocal_nvfp4() -> bool:
    """NV-FP4 with 1xBC blocks (no Hadamard transform, no stochastic rounding) by the row-local
    ``_nv_fp4_rowblock_kernel`` instead of ``_fp4_cast_kernel``'s 2-D tiles (the tensor amax pass
    unchanged); its prefetch is ``rowlocal_fp4_prefetch``'s. H200 (2026-12-01, session 8,
    16384x4096 bf16, kernel time, bit-exact there): 0.163 ms in all, 25.1% of copy (the cast 0.123)
    against 0.200, 20.5% (0.160); with prefetch 0.169; 8192- / 2048-element tiles 0.171 / 0.162.
    sm_90 (triton 3.6): 47 registers, 5 programs an SM, 48 SASS instructions an element (the exact
    division and the NaN-aware encode; MX's multiply by 2^-k: 29)."""
    return True


def rowlocal_fp4_prefetch() -> bool:
    """The row-local MX-FP4 cast loads tile t + programs before working on tile t: off (sm_90,
    triton 3.6, 16384x4096 bf16: 58 registers, 4 programs an SM, 31.9 SASS instructions an
    element with it; 40, 6 and 29.2 without)."""
    return False


def rowlocal_fp4_pairs() -> bool:
    """The row-local MX- and NV-FP4 casts of a contiguous bf16 x by ``_mx_fp4_pairs_kernel`` /
    ``_nv_fp4_pairs_kernel`` (int32 words of two elements in, a code byte a word out) instead of
    ``_mx_fp4_rowblock_kernel`` / ``_nv_fp4_rowblock_kernel``. sm_90 (triton 3.6, 16384x4096 bf16),
    SASS instructions an element: MX 12.6 (23.6 for the element kernel), NV 25.9 (44.2). H200
    (2026-12-02, session 10, kernel time, bit-exact there): MX 0.0452 ms, 88.9% of copy, against
    0.0693 (57.9%); NV 0.103 (amax pass included), 39.6%, against 0.153."""
    return True


def fp4_ptx_encode() -> bool:
    """On the GPU the pair kernels take the block amax in bf16x2 PTX (``e2m1_encode._bf16x2_amax``)
    and ``_mx_fp4_pairs_kernel`` encodes a pair at a time (``_e2m1_pairs``: bf16x2 and 16-bit
    SIMD) instead of two fp32 ``_e2m1_signed``. H200 (session 10, 16384x4096 bf16): MX 0.0452 ms
    against 0.0639 without, NV 0.103 against 0.116."""
    return True


def rowlocal_fp4_finite() -> bool:
    """The row-local MX-FP4 cast's finite-tile path (as ``rowlocal_finite_tiles``): off (74
    registers for 26.7 instructions an element on the finite path; capped at 48 it spills in the
    loop)."""
    return False


# ---- launches ----------------------------------------------------------------------------------------

def delayed_amax_slots() -> bool:
    """Delayed scaling: the cast writes one amax slot a program and the state-update kernel reduces
    them (two launches: cast, update), instead of an atomic max into a zero-filled scalar (three:
    zero-fill, cast, update). Same amax (max is exact in any order), same state."""
    return True


def amax_reverse_walk() -> bool:
    """The tensor amax pass before a cast (current scaling, NVFP4) walks its tiles last to first, so
    the cast, walking first to last, starts on the tiles the amax read last (still in L2 when x is
    larger than L2). The amax is the same in any order. H200 (2026-12-01, session 8, 16384x4096
    bf16, kernel time, bit-exact there): current E4M3 0.0831 ms against 0.0868 forward, current
    E5M2 + T 0.117 against 0.122, NVFP4 1x16 0.160 against 0.163."""
    return True


def amax_reduce_block() -> int:
    """Slots a reduction of amax slots loads at a time (``_get_amax`` loops over blocks): 4096."""
    return 4096


def current_amax_programs(x, programs: int) -> int:
    """Programs (and slots) of the amax kernel with ``current_amax_slots``: a quarter of the cast's,
    about one wave, on the GPU; as many as the cast's under the interpreter."""
    return max(1, programs // 4) if x.device.type == "cuda" else programs


def current_amax_slots() -> bool:
    """Current scaling: the amax kernel (one wave: ``max_programs // 4`` programs) writes one slot
    a program and every cast program reduces them (two launches instead of three; each cast
    program reads the slots from L2, ~2 KB)."""
    return False

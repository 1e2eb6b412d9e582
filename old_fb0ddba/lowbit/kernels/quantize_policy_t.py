"""Launch policy of the fused quantize kernels with a transposed copy (the tensorwise, rowwise, 1xBC-
and BxB-block casts that also write ``x.t()``'s codes): part of ``quantize_policy``, which imports
every function here; the launchers and the sweeps read and replace them there (``policy.<name>``),
never here. Each changes no bit of any result.
"""
from __future__ import annotations


# ---- tensorwise (quantize_fp8_tensor_row_kernels._cast_tensor_kernel, quantize_fp8_transpose_kernels) ----

def transpose_tile(x) -> tuple:
    """(rows, columns) at most of a tile of the tensorwise casts that also write the transposed
    copy (the store of the copy goes through shared memory): 32 x 128 on the GPU, 128 x 128 under
    the interpreter. H200 sweep (2026-12-01, 16384x4096 bf16, kernel time of the delayed E4M3 cast
    + transpose; the current E5M2 one in brackets): 32x128 / 8 warps / prefetch 0.0872 ms (0.0833),
    64x128 / 16 0.0890 (0.0842), 64x64 / 16 (before) 0.0988 (0.0868), 128x128 / 16 0.103. Tiles of
    128 x 64 wrote E5M2 codes to wrong places on the H200 (triton 3.6; exact under the interpreter
    and for E4M3, cause not found): not used."""
    from . import quantize_policy  # (which imports this module) at call time: its tile_elems may be replaced
    return (128, 128) if quantize_policy.tile_elems(x) > 8192 else (32, 128)


def transpose_warps(elems: int) -> int:
    """Warps of the transposing tensorwise cast: 8 (16 elements a thread at 32 x 128)."""
    return 8


def transpose_maxnreg(num_warps: int):
    """Registers a thread at most of the transposing tensorwise cast (the ``maxnreg`` launch
    option): 64 at 8 warps, 4 programs an SM and no spills on sm_90 with triton 3.6 (the
    compiler's choice: 72, 3 programs). H200 (2026-12-01, session 7, 16384x4096 bf16, kernel
    time, bit-exact there): delayed E4M3 + T 0.0825 ms (76.9% of copy) against 0.0886 (71.6%),
    current E5M2 + T 0.122 against 0.127; 56 registers (spills): 0.0898 / 0.122."""
    return 64 if num_warps == 8 else None


def transpose_one_read() -> bool:
    """The tensorwise casts with the transposed copy by ``_cast_tensor_t_reg_kernel`` (each tile
    read once and held in registers, as the 128x128 block cast) instead of ``_cast_tensor_kernel``'s
    grid-stride tiles (H200, 2026-12-02, kernel time, bit-exact there: delayed E4M3 + T 0.0796 ms
    at 16384x4096 and 8192x8192 against 0.0836, current E5M2 + T 0.119 either way)."""
    return True


def transpose_one_read_tile() -> tuple:
    """(rows, columns) of a tile of ``_cast_tensor_t_reg_kernel``: 128 x 128 (8 warps, 80
    registers). H200 (2026-12-02, 8192x8192 bf16, kernel time): 64 x 128 at 4 warps ran the cast
    faster alone (delayed E4M3 + T 0.0743 ms capped at 80 registers, 0.0777 at the compiler's 96,
    against 0.0796; current E5M2 + T 0.112 against 0.119), but the compiled FFN step with lowbit
    fp8 (``benchmarks/ffn_train.py``) ran 9.95 ms with it, twice, against 8.36 with 128 x 128; the
    eager step 8.95 against 8.90 (cause not found). 128 x 64: 0.0802; 32 x 128: 0.0819."""
    return 128, 128


def transpose_one_read_warps(elems: int) -> int:
    """Warps of ``_cast_tensor_t_reg_kernel``: 64 elements a thread (8 at 128 x 128)."""
    return max(1, min(8, elems // 2048))


def transpose_one_read_maxnreg(num_warps: int):
    """Registers a thread at most of ``_cast_tensor_t_reg_kernel``: 80 at 4 and 8 warps (3 programs
    an SM at 128 x 128, 16 bytes of stack; 6 at 64 x 128). H200 (2026-12-02, 8192x8192 bf16,
    kernel time, bit-exact there): at 128 x 128 the compiler's 128 registers gave delayed E4M3 + T
    0.0949 ms against 0.0796; at 64 x 128, 0.0777 with its 96 against 0.0743."""
    return 80 if num_warps in (4, 8) else None


def transpose_prefetch() -> bool:
    """The transposing tensorwise cast loads its next grid-stride tile before computing this one."""
    return True


# ---- rowwise and blocks (quantize_fp8_transpose_kernels, _rowwise_t_kernels, _cols_t_kernels) ----

def block_t_tiles() -> bool:
    """1xBC blocks with the transposed copy by the two-sweep kernel (``_cast_1xn_t_sweep_kernel``)
    instead of ``_cast_blocks_kernel``'s chunks (H200, 2026-12-01, 16384x4096 bf16, kernel time,
    bit-exact there: 0.184 ms against 0.428; session 5's whole-tile kernel 0.264)."""
    return True


def rowwise_t_tiles() -> bool:
    """Rowwise with the transposed copy by the three launches of ``quantize_fp8_rowwise_t_kernels``
    (2-D amax pass into slots, slot reduction, sweep cast; 0.218 ms at 16384x4096 on the H200)
    instead of zero-fill x2, atomic amax and ``_cast_rowwise_kernel`` (four; 0.456 ms). The lean
    encode plays no part in it (the finite-slice encode needs no NaN handling, the rare
    non-finite slices take the plain one)."""
    return True


def block_t_split() -> bool:
    """1xBC blocks (BC >= 16) with the transposed copy as two launches: x's copy by the row-local
    1xBC cast, the transposed copy alone by ``quantize_fp8_cols_t_kernels`` (x read twice, the
    second time partly from L2), instead of the one-launch two-sweep kernel (H200, 2026-12-02,
    8192x8192 bf16, kernel time, bit-exact there: 1x128 + T 0.123 ms against 0.183)."""
    return True


def rowwise_t_split() -> bool:
    """Rowwise with the transposed copy as column amax slots, column scales, the row-local rowwise
    cast and the transposed copy alone (``quantize_fp8_cols_t_kernels``, the scales given),
    instead of ``rowwise_t_tiles``' three launches (both copies from one sweep cast; H200,
    2026-12-02, 8192x8192 bf16, kernel time, bit-exact there: 0.167 ms against 0.224)."""
    return True


def cols_t_cols() -> int:
    """Columns of a tile of ``_cast_cols_t_kernel`` (the transposed copy alone): 32 (H200,
    2026-12-02, 8192x8192 bf16, kernel time, bit-exact there, 1x128 + T: 0.122 ms in all at 128 x
    32 and 1 warp (168 registers, 12 programs an SM), against 0.136 at 128 x 32 and 2 warps or
    at 128 x 16, 0.150 at 128 x 64 and 1 warp, 0.185 at 128 x 128 and 4 warps; the two-sweep
    one-launch kernel 0.183)."""
    return 32


def cols_t_rows() -> int:
    """Rows of a tile of ``_cast_cols_t_kernel`` with the column scales given (rowwise; with BCx1
    blocks a tile is one block tall): 64 (H200, 2026-12-02, 8192x8192 bf16, kernel time, bit-exact
    there, the rowwise + T column kernel alone: 0.0620 ms at 64 x 32 and 1 warp, against 0.0630 at
    32 x 64, 0.0660 at 64 x 64, 0.0667 at 128 x 32, 0.0746 at 32 x 128; 0.0681 at 64 x 128 and 2
    warps)."""
    return 64


def cols_t_warps(elems: int) -> int:
    """Warps of ``_cast_cols_t_kernel``: 128 elements a thread (a 128x32 tile: 1 warp), at most 8.
    Every thread holding a column makes its scale parts, so more rows a thread cost fewer
    instructions an element (sm_90, triton 3.6, 1x128, 128 x 64 tiles, the finite path: 22.0 at 2
    warps, 31.9 at 4, 35.9 at 8)."""
    return max(1, min(8, elems // 4096))


def cols_t_slice_rows() -> int:
    """Rows of a slice of ``_cast_cols_t_kernel``'s rare paths (a tile holding NaN or inf: the
    finite amax and the plain encode, re-read from L2 slice by slice)."""
    return 16


def cols_t_maxnreg(num_warps: int):
    """Registers a thread at most of ``_cast_cols_t_kernel``: the compiler's choice (H200,
    2026-12-02, 8192x8192 bf16: 128 made 1x128 + T 0.136 ms against 0.122; 168 the same)."""
    return None


def cols_t_reverse() -> bool:
    """``_cast_cols_t_kernel`` (and the rowwise column amax before the row-local cast) walk the
    tiles last to first: the row-local cast before it ends on the last rows, still in L2."""
    return True


def block_t_tile() -> int:
    """Columns of a program of the 1xBC and rowwise + transpose sweep casts (at least BC)."""
    return 128


def square_t_kernel() -> bool:
    """BxB blocks (128x128 weights) with the transposed copy by ``_cast_square_t_kernel`` (a block
    a program: one amax sweep, one division an element, the codes written twice) instead of
    ``_cast_blocks_kernel`` (0.148 ms at 16384x4096 on the H200, 43% of copy)."""
    return True


def square_t_one_read() -> bool:
    """BxB blocks with the transposed copy by ``_cast_square_t_reg_kernel`` (the block read once and
    held in registers) instead of the two-sweep ``_cast_square_t_kernel`` (H200, 2026-12-01,
    session 7, 16384x4096 bf16, kernel time, bit-exact there: 0.0826 ms at 8 warps against 0.0875;
    4 warps 0.0918, 16 warps 0.0977)."""
    return True


def square_t_one_read_warps(elems: int) -> int:
    """Warps of ``_cast_square_t_reg_kernel``: 8 (a 128x128 block: 64 elements a thread)."""
    return max(1, min(8, elems // 2048))


def square_t_one_read_maxnreg(num_warps: int):
    """Registers a thread at most of ``_cast_square_t_reg_kernel``: 80 at 8 warps, 3 programs an SM
    (sm_90, triton 3.6: 48 bytes of stack) against the compiler's 128 and 2. H200 (2026-12-01,
    session 7, 16384x4096 bf16, kernel time, bit-exact there): 0.0763 ms (83.2% of copy) against
    0.0827 (76.7%)."""
    return 80 if num_warps == 8 else None


def block_t_sweep_rows() -> int:
    """Rows of a slice of the two-sweep 1xBC + transpose cast: 32 (H200, 2026-12-01, 16384x4096
    bf16, 128-column tiles, 4 warps: 0.194 ms against 0.222 with 16-row slices)."""
    return 32


def block_t_sweep_prefetch() -> bool:
    """The two-sweep cast's second sweep loads slice i + 1 before it works on slice i (H200,
    2026-12-01, 16384x4096 bf16, 4 warps: 0.184 ms against 0.195 with 32-row slices, 0.203
    against 0.222 with 16; 64-row slices 0.229 against 0.211)."""
    return True


def t_sweep_warps(elems: int) -> int:
    """Warps of the sweep casts: 4 (H200, 2026-12-01, 16384x4096 bf16: 1x128 + T 0.221 ms against
    0.232 with 8 (16-row slices), 128x128 + T 0.087 against 0.092, rowwise + T 0.143 against 0.214)."""
    return max(1, min(4, elems // 256))


def rowwise_t_sweep_rows() -> tuple:
    """(rows a program, rows a slice) of ``_cast_rowwise_t_sweep_kernel``: 128 and 32 (H200,
    2026-12-01, 16384x4096 bf16, 4 warps: 0.143 ms against 0.195 for the 64x64 tile kernel;
    256 rows 0.140, 16-row slices 0.206, 8 warps 0.214)."""
    return 128, 32


def rowwise_t_amax_tile(x) -> tuple:
    """(rows a program, rows a slice, columns) of ``_rowwise_t_amax2d_kernel``: 512 x 128 in
    32-row slices (H200, 2026-12-01, 16384x4096 bf16: the rowwise + transpose cast 0.218 ms
    against 0.226-0.229 with 256 x 64 in 64-row slices; 256 x 32 x 64, 512 x 64 x 64, 128 x 64 x 64
    and 256 x 32 x 128 within 2% of each other with the tile cast)."""
    return 512, 32, 128

"""Launch choices of the fused casts (FP8 here, FP4 in ``cast_fp4``): one frozen table.

Every field changes no bit of any result: only the geometry (tiles, warps, programs, register
caps) and a few equivalent code paths (prefetching, finite-tile encodes, the exact reciprocal
division, the PTX encodes). ``CAST_TUNING`` holds the defaults (chosen on the H200,
``benchmarks/TUNING.md``); ``CAST_TUNING.override(name=value, ...)`` gives another table for a
sweep, which a backend built with it (``lowbit.kernels.triton.make_backend(cast_tuning=...)``)
launches with, leaving the default backend alone.

Geometry the launchers derive from the fields:

* elementwise tiles of ``tile_elems`` elements (``tile_elems_interpreted`` under the Triton
  interpreter, whose cost is per operation), ``warps(elems) = clamp(elems // elems_per_warp,
  min_warps, max_warps)`` warps (~8 elements a thread);
* grid-stride programs: ``warps_per_sm`` warps' worth an SM (several waves of resident
  programs, so every SM stays evenly loaded whatever the occupancy), ``interpreted_programs``
  under the interpreter (so the grid-stride loops run more than once);
* the tensorwise flat walks: half the warps (16 elements a thread: two 16-byte loads, one
  16-byte store a thread);
* the row-local walks (rowwise, 1xBC blocks, MX-FP4, NV-FP4 without a transposed copy): tiles of
  ``tile_elems``, 16 elements a thread (``rowlocal_elems_per_warp``), rows up to
  ``rowlocal_max_cols`` held whole;
* the tensorwise cast with the transposed copy: ``transpose_tile`` tiles, one read each, held in
  registers (``transpose_maxnreg`` a thread); its current-scaling amax pass walks
  ``amax_t_tile`` tiles at ``amax_t_warps`` warps;
* the rowwise / 1xBC casts with the transposed copy: the column-only cast's tiles
  (``cols_t_rows`` x ``cols_t_cols``), the rowwise sweep kernels' blocks.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Tuple

__all__ = ["CastTuning", "CAST_TUNING"]


@dataclass(frozen=True)
class CastTuning:
    # elementwise tiles, warps and grid-stride programs
    tile_elems: int = 4096
    tile_elems_interpreted: int = 16384
    elems_per_warp: int = 256
    min_warps: int = 4
    max_warps: int = 16
    warps_per_sm: int = 256
    interpreted_programs: int = 3
    # element arithmetic: the exact two-step reciprocal division instead of div.rn.f32 per element,
    # the lean encode (magnitude and sign apart), NaN left to cvt.rn.satfinite
    fast_div: bool = True
    lean_encode: bool = True
    cvt_handles_nan: bool = True
    # tensorwise: amax passes walk last to first (the cast then starts on tiles still in L2)
    amax_reverse: bool = True
    amax_reduce_block: int = 4096
    # 1x32 / 1x128 / 128x128 block casts: chunks a program works through
    block_chunks: int = 4
    # row-local walks
    rowlocal_max_cols: int = 8192
    rowlocal_elems_per_warp: int = 512
    rowlocal_prefetch: bool = True
    rowlocal_finite_tiles: bool = True
    rowlocal_maxnreg: Optional[int] = 48
    # tensorwise with the transposed copy: one read a tile; the current-scaling amax pass before it
    transpose_tile: Tuple[int, int] = (128, 128)
    transpose_maxnreg: Optional[int] = 80
    amax_t_tile: Tuple[int, int] = (32, 128)
    amax_t_tile_interpreted: Tuple[int, int] = (128, 128)
    amax_t_warps: int = 8
    amax_t_maxnreg: Optional[int] = 64
    # BxB blocks with the transposed copy (a block a program, held in registers)
    square_t_maxnreg: Optional[int] = 80
    # rowwise / 1xBC with the transposed copy: the column-only cast, the rowwise sweep kernels
    cols_t_cols: int = 32
    cols_t_rows: int = 64
    cols_t_elems_per_warp: int = 4096
    cols_t_slice_rows: int = 16
    cols_t_reverse: bool = True
    rowwise_t_amax_tile: Tuple[int, int, int] = (512, 32, 128)
    rowwise_t_sweep_rows: Tuple[int, int] = (128, 32)
    rowwise_t_sweep_cols: int = 128
    # FP4: bf16 pair kernels (int32 words of two elements) and their PTX amax / encode
    fp4_pairs: bool = True
    fp4_ptx_encode: bool = True

    def override(self, **changes) -> "CastTuning":
        """This table with ``changes`` (field names) replaced; unknown names raise TypeError."""
        return dataclasses.replace(self, **changes)

    # ---- formulas -----------------------------------------------------------------------------
    def tile(self, interpreted: bool) -> int:
        return self.tile_elems_interpreted if interpreted else self.tile_elems

    def warps(self, elems: int) -> int:
        """Warps of an elementwise tile of ``elems`` elements."""
        return min(self.max_warps, max(self.min_warps, elems // self.elems_per_warp))

    def opts(self, elems: int) -> dict:
        """Launch options: no FP contraction (every op rounds as torch's does), ``warps(elems)``."""
        return dict(enable_fp_fusion=False, num_warps=self.warps(elems))

    def programs(self, sms: Optional[int], num_warps: int) -> int:
        """Grid-stride programs: ``warps_per_sm`` warps' worth an SM (``sms`` None: interpreted)."""
        return sms * max(1, self.warps_per_sm // num_warps) if sms else self.interpreted_programs

    def rowlocal_warps(self, elems: int) -> int:
        return min(16, max(1, elems // self.rowlocal_elems_per_warp))

    def cols_t_warps(self, elems: int) -> int:
        return max(1, min(8, elems // self.cols_t_elems_per_warp))

    @staticmethod
    def t_sweep_warps(elems: int) -> int:
        """Warps of the rowwise sweep cast with the transposed copy."""
        return max(1, min(4, elems // 256))

    @staticmethod
    def reg_tile_warps(elems: int) -> int:
        """Warps of the kernels holding a tile in registers: 64 elements a thread, at most 8."""
        return max(1, min(8, elems // 2048))


CAST_TUNING = CastTuning()

"""Launch choices of the FP4 GEMMs: one frozen table (``GEMM_FP4_TUNING``), ``override()`` for sweeps.

No field changes a bit of any result: the decode is exact either way, and the configurations
change tiles, K splits (whose partials are added in split order) and pipelining.

* ``ptx_decode``: the PTX decode on sm_90 with bf16 (``decode``), else the portable one.
* ``mm_configs``: the FP4 x FP4 kernel's autotuning pool, ``(warps, stages, BLOCK_M, BLOCK_N,
  BLOCK_K)``: BLOCK_K = 128 keeps the dequantized A tile at 32-64 registers a thread and holds
  whole scale blocks (16 .. 128); tiles no larger than the problem are kept (the smallest always).
* ``wo_configs``: the weight-only kernel's pool, ``(warps, stages, BLOCK_N, BLOCK_M, BLOCK_K,
  SPLIT_K, maxnreg)``; BLOCK_M is the MMA's N: the smallest of 16 / 32 / 64 / 128 that covers M;
  each split keeps >= 2 K steps; at M <= 16 ``wo_decode_tile`` alone where it fits (not
  autotuned: the autotuner's pick there varied between runs).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Tuple

__all__ = ["GemmFP4Tuning", "GEMM_FP4_TUNING"]


@dataclass(frozen=True)
class GemmFP4Tuning:
    ptx_decode: bool = True
    mm_configs: Tuple[tuple, ...] = ((8, 3, 128, 128, 128), (8, 3, 128, 256, 128), (8, 4, 128, 128, 128),
                                     (4, 4, 64, 128, 128))
    wo_configs: Tuple[tuple, ...] = (
        (8, 3, 256, 16, 128, 8, 128), (8, 4, 128, 16, 128, 4, None), (8, 4, 128, 16, 128, 6, None),
        (4, 4, 64, 16, 128, 4, None), (4, 4, 64, 16, 128, 2, None), (4, 4, 256, 16, 64, 8, None),
        (8, 4, 128, 32, 128, 4, None), (4, 3, 64, 32, 128, 4, None),
        (8, 3, 128, 64, 128, 4, None), (4, 3, 64, 64, 128, 4, None), (8, 3, 128, 64, 128, 2, None),
        (8, 3, 128, 128, 128, 2, None), (4, 3, 64, 128, 128, 2, None), (8, 3, 128, 128, 128, 4, None))
    wo_decode_tile: tuple = (8, 3, 256, 16, 128, 8)  # (warps, stages, BLOCK_N, BLOCK_M, BLOCK_K, SPLIT_K)
    wo_fallback: tuple = (4, 3, 64, 64, 128, 1)  # BLOCK_M and BLOCK_K adjusted to the call

    def override(self, **changes) -> "GemmFP4Tuning":
        return dataclasses.replace(self, **changes)


GEMM_FP4_TUNING = GemmFP4Tuning()

"""Launch choices of the FP8 GEMMs: one frozen table (``GEMM_FP8_TUNING``), ``override()`` for sweeps.

No field changes a bit of any result of a given kernel: the warp-specialized Gluon kernel gives
the same bits in every ``WSConfig``; the plain-Triton kernels' configurations change tiles and
pipelining only (the summation order within a chunk is the tensor cores' either way, and the
promotion order is fixed). Which kernel runs (``kernel``) can change the bits of an unpromoted
(fast-accumulation) product, so benchmarks name it when they force one.

* ``kernel``: ``"auto"`` (the promoting warp-specialized Gluon kernel where it applies: sm_90, at
  least ``gluon_min_m`` rows, promoting, tensorwise / rowwise / 1x128 x 128x128 / 1x128 x 128x1
  scales; else the TMA kernel on sm_90+ for K-major operands, else the pointer kernel), or one of
  ``"ws"``, ``"tma"``, ``"pointer"`` (benchmarks' A/B runs).
* The Gluon kernel's configuration by output size and mode (``ws_config``): GROUP_M 16 and the
  epilogue under the next tile's first wgmmas from ``ws_large`` output elements up (not for
  blockwise_cols); the blockwise modes read their chunk scales from the shared-memory ring.
* The plain-Triton autotuning pools, rows ``(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages,
  persistent)``: promoted accumulation holds two fp32 tiles (sum and chunk), so its tiles are
  128x128 at most; M <= 128 takes the narrow-tile pool (more programs on the SMs); the fast pool is
  persistent-only.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Tuple

__all__ = ["WSConfig", "WS_CONFIGS", "GemmFP8Tuning", "GEMM_FP8_TUNING", "chunk_of"]


@dataclass(frozen=True)
class WSConfig:
    """A launch configuration of the warp-specialized kernel. Registers: 12 warps (3 warp groups,
    the producer's one warp rounded up) share 64K a CTA, so ``maxnreg <= 170``; the default
    partition gets what ``maxnreg`` leaves (232 here, as the worker). ``epi_overlap``: a tile's
    epilogue under the next tile's first two wgmmas; ``smem_scales``: blockwise chunk scales from
    the shared-memory ring (tensorwise and rowwise ignore it)."""
    block_n: int = 128
    stages: int = 3
    subk: int = 2
    group_m: int = 8
    consumer_regs: int = 232
    producer_regs: int = 40
    maxnreg: int = 168
    epi_overlap: bool = False
    smem_scales: bool = False


WS_CONFIGS = {
    "ws_s3": WSConfig(),
    "ws_s3_ss": WSConfig(smem_scales=True),
    "ws_s3_g16_eo": WSConfig(group_m=16, epi_overlap=True),
    "ws_s3_g16_ss": WSConfig(group_m=16, smem_scales=True),
    "ws_s3_g16_ss_eo": WSConfig(group_m=16, epi_overlap=True, smem_scales=True),
}


def chunk_of(sa_k: int, sb_k: int) -> int:
    """K chunk inside which both K-scales are constant (0: no K-scale at all)."""
    ks = [k for k in (sa_k, sb_k) if k]
    return math.gcd(*ks) if ks else 0


@dataclass(frozen=True)
class GemmFP8Tuning:
    kernel: str = "auto"
    gluon_min_m: int = 128
    ws_large: int = 8192 * 8192
    ws_small: WSConfig = WS_CONFIGS["ws_s3"]
    ws_small_blockwise: WSConfig = WS_CONFIGS["ws_s3_ss"]
    ws_large_scaled: WSConfig = WS_CONFIGS["ws_s3_g16_eo"]  # tensorwise, rowwise
    ws_large_blockwise: WSConfig = WS_CONFIGS["ws_s3_g16_ss_eo"]
    ws_large_cols: WSConfig = WS_CONFIGS["ws_s3_g16_ss"]
    fast_pool: Tuple[tuple, ...] = ((128, 256, 128, 8, 3, 1), (128, 256, 64, 8, 4, 1), (128, 128, 128, 8, 4, 1))
    precise_pool: Tuple[tuple, ...] = ((128, 128, 128, 8, 4, 1), (64, 128, 128, 4, 4, 0), (128, 128, 128, 8, 3, 0))
    small_pool: Tuple[tuple, ...] = ((64, 128, 128, 4, 4, 0), (64, 64, 128, 4, 6, 0), (64, 32, 128, 4, 8, 0),
                                     (128, 64, 128, 4, 6, 0))
    small_m: int = 128
    group_m: int = 8

    def override(self, **changes) -> "GemmFP8Tuning":
        """This table with ``changes`` replaced (``kernel="tma"``, ``ws_small=WSConfig(...)``, ...)."""
        if changes.get("kernel", self.kernel) not in ("auto", "ws", "tma", "pointer"):
            raise ValueError(f"kernel must be 'auto', 'ws', 'tma' or 'pointer', got {changes['kernel']!r}")
        return dataclasses.replace(self, **changes)

    def ws_config(self, M: int, N: int, mode: str) -> WSConfig:
        """The Gluon kernel's configuration for an (M, N) output in ``mode``."""
        blockwise = mode.startswith("blockwise")
        if M * N < self.ws_large:
            return self.ws_small_blockwise if blockwise else self.ws_small
        return {"blockwise": self.ws_large_blockwise, "blockwise_cols": self.ws_large_cols}.get(mode,
                                                                                               self.ws_large_scaled)

    def pool(self, M: int, promoting: bool) -> Tuple[tuple, ...]:
        """The plain-Triton autotuning pool of an M-row GEMM."""
        return self.small_pool if M <= self.small_m else (self.precise_pool if promoting else self.fast_pool)

    def all_rows(self) -> list:
        return list(dict.fromkeys(self.fast_pool + self.precise_pool + self.small_pool))


GEMM_FP8_TUNING = GemmFP8Tuning()

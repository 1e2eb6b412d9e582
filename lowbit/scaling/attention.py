"""The FP8 attention recipe: which operands are rounded to what, and with which scales.

``AttentionRecipe`` (frozen) fixes the numbers ``lowbit.nn.functional.scaled_dot_product_attention``
computes (the Triton kernels and the exact emulation alike):

* Q, K, V (forward and backward) and dO (backward) are E4M3 codes with one scale per ``block``
  consecutive tokens of one head of one sequence, over the whole head dim: ``scale = amax / 448``
  (fp32, at least 2^-126 so that 1 / scale is finite; 1 for an all-zero block) and
  ``codes = RNE(x * RN(1 / scale))``, saturating, so the
  block's largest magnitude is exactly 448 codes. ``block=0``: one scale per head and sequence.
  A block holding inf or NaN gets a NaN scale (its outputs are NaN, never a silent clip).
  E4M3's relative rounding does not depend on the scale, so per-block scales matter where a
  head's range exceeds E4M3's (about 2^17) and for the block maxima, which are exact.
* P (the softmax numerator ``exp2(s - m)`` with ``m`` the running row max, so ``0 <= P <= 1``) is
  rounded to E4M3 as ``RNE(P * 256) / 256`` (a fixed power-of-two scale: every P above 2^-14 is a
  normal E4M3 number, and the largest P of each row, 1, is exact). The row sums ``l`` add the
  fp32 P (before rounding).
* dS (backward, ``dS = P * (dP - delta)``) is rounded to E4M3 for the dQ and dK products row by
  row: for dK each key's entries in one query tile of the dK/dV kernel share a scale
  ``amax / 448``, for dQ each query's entries in one key tile of the dQ kernel (the dimension
  each product sums over, so the scale factors out of it). Measured on the emulation (float64
  reference, N(0,1) inputs with 0.1% of 20x outliers, the issue's three shapes): with these row
  scales every gradient's error is within 1% of what bf16 or exact dS give (one scale per 64 x 64
  tile was up to 3% worse), and E5M2 for dO (the HYBRID gradient format) makes them worse, so dS,
  dP's operands and dO are all E4M3.
* ``hadamard=True`` rotates Q and K along the head dim before quantizing (FlashAttention-3's
  incoherent processing): ``q' = q R``, ``k' = k R`` with ``R = diag(signs) H`` block diagonal,
  ``H`` the +-1 Sylvester matrix of size ``hb`` (the largest power of two dividing the head dim,
  at most 128) and ``signs`` random (``seed``). ``R R^T = hb I``, so ``q' k'^T = hb q k^T`` and the
  softmax scale is divided by ``hb`` (exact); the gradients of q', k' are rotated back by ``R^T``.
  Spreading an outlier over ``hb`` elements shrinks the score error it causes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .hadamard import random_signs, sylvester

__all__ = ["AttentionRecipe", "P_SCALE"]

P_SCALE = 256.0  # P is rounded as RNE_e4m3(P * P_SCALE) / P_SCALE
_MAX_ROTATION = 128


@dataclass(frozen=True)
class AttentionRecipe:
    """FP8 attention numerics (module docstring). ``block``: tokens per scale (0 or a power of two
    >= 16; the kernels' tiles are clipped to it); ``hadamard``: rotate Q and K (signs from ``seed``)."""

    block: int = 128
    hadamard: bool = False
    seed: int = 0

    def __post_init__(self):
        b = self.block
        if not isinstance(b, int) or isinstance(b, bool) or (b != 0 and (b < 16 or b & (b - 1))):
            raise ValueError(f"AttentionRecipe.block must be 0 (one scale per head) or a power of two >= 16, "
                             f"got {b!r}")
        if not isinstance(self.hadamard, bool) or not isinstance(self.seed, int):
            raise TypeError(f"AttentionRecipe.hadamard must be a bool and seed an int, got {self.hadamard!r}, "
                            f"{self.seed!r}")

    def rotation_block(self, head_dim: int) -> int:
        """``hb``: the size of the Hadamard blocks along ``head_dim`` (1 without rotation)."""
        if not self.hadamard:
            return 1
        return min(head_dim & -head_dim, _MAX_ROTATION)

    def rotation(self, head_dim: int, device=None) -> Optional[torch.Tensor]:
        """``R`` (fp32, entries +-1, ``head_dim x head_dim``), or None without rotation."""
        if not self.hadamard:
            return None
        hb = self.rotation_block(head_dim)
        h = torch.block_diag(*([sylvester(hb)] * (head_dim // hb)))
        return (random_signs(self.seed, n=head_dim)[:, None] * h).to(device)

    def tiles(self, block_m: int, block_n: int) -> Tuple[int, int]:
        """Kernel tiles clipped to the scale block, so that every tile has one scale per operand."""
        if self.block == 0:
            return block_m, block_n
        return min(block_m, self.block), min(block_n, self.block)

"""Counter-based uniforms for stochastic rounding: Philox4x32-10 (Salmon et al., SC'11), the round
function of Random123 and of ``triton.language.philox_impl``.

``Philox(key, stream)``: ``key`` an int64 tensor ``(seed, step)`` on the data's device. Element ``i``
(row-major index) of a tensor draws

    u_i = (r >> 8) * 2^-24,   r = word 0 of Philox4x32-10(counter = (i mod 2^32, i >> 32,
                                                            step mod 2^32, step >> 32),
                                                  key = (seed mod 2^32, stream))

so ``u`` is uniform on [0, 1) in steps of 2^-24 and a function of (seed, stream, step, i) alone: a
draw keeps no generator state, reads its key on the device (no host sync), and a CUDA graph that
replays it draws anew as the step in ``key`` advances there. The Triton casts compute the same
words (``kernels/triton/jit_common._philox_uniform``); this is the torch reference, in int64
arithmetic (each 32x32-bit product split at 16 bits, exact).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["Philox", "philox4x32", "ROUND_A", "ROUND_B", "KEY_A", "KEY_B"]

ROUND_A, ROUND_B = 0xD2511F53, 0xCD9E8D57  # the round multipliers (of counter words 0 and 2)
KEY_A, KEY_B = 0x9E3779B9, 0xBB67AE85  # the key increments (Weyl sequence)
ROUNDS = 10
_MASK = 0xFFFFFFFF


def _mulhilo(a: torch.Tensor, m: int):
    """(high, low) 32-bit words of ``a * m`` for int64 ``a`` in [0, 2^32) and a constant ``m``."""
    p1 = a * (m & 0xFFFF)  # < 2^48
    p2 = a * (m >> 16)  # < 2^48
    t = p1 + ((p2 & 0xFFFF) << 16)  # < 2^49
    return (p2 >> 16) + (t >> 32), t & _MASK


def philox4x32(c0, c1, c2, c3, k0, k1, rounds: int = ROUNDS):
    """The four output words (int64 tensors in [0, 2^32)) of Philox4x32 for counter words
    ``c0..c3`` and key words ``k0, k1`` (int64 tensors or ints in [0, 2^32), broadcast)."""
    for _ in range(rounds):
        hi0, lo0 = _mulhilo(c0, ROUND_A)
        hi1, lo1 = _mulhilo(c2, ROUND_B)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + KEY_A) & _MASK, (k1 + KEY_B) & _MASK
    return c0, c1, c2, c3


@dataclass(frozen=True, eq=False)
class Philox:
    """The draws of one stochastic rounding: ``key`` (int64 ``(seed, step)``, read where it lives),
    ``stream`` (tells apart the draws of one step: e.g. dgrad's and wgrad's operand)."""

    key: torch.Tensor
    stream: int = 0

    def __post_init__(self):
        if not (isinstance(self.key, torch.Tensor) and self.key.dtype == torch.int64 and self.key.numel() == 2):
            raise TypeError(f"Philox key must be an int64 tensor (seed, step), got {self.key!r}")
        if not (isinstance(self.stream, int) and 0 <= self.stream <= _MASK):
            raise ValueError(f"Philox stream must be an int in [0, 2^32), got {self.stream!r}")

    def key_on(self, device) -> torch.Tensor:
        """``key`` as the 2 contiguous int64 of ``(seed, step)`` on ``device`` (a kernel reads them)."""
        return self.key.to(device).reshape(2).contiguous()

    def uniform(self, shape, device) -> torch.Tensor:
        """float32 ``u`` of ``shape`` (module docstring), on ``device``."""
        key = self.key_on(device)
        n = math.prod(shape)
        i = torch.arange(n, dtype=torch.int64, device=device)
        step = key[1]
        r, _, _, _ = philox4x32(i & _MASK, i >> 32, (step & _MASK).expand(n), (step >> 32).expand(n),
                                key[0] & _MASK, self.stream)
        return ((r >> 8).to(torch.float32) * 2.0 ** -24).reshape(shape)

"""Integer helpers of the host-side launchers: ``triton.cdiv`` and ``triton.next_power_of_2`` are
``constexpr_function`` objects (a few microseconds a call through their wrapper); these are the
same formulas in plain Python."""
from __future__ import annotations

__all__ = ["cdiv", "next_pow2"]


def cdiv(x: int, y: int) -> int:
    """ceil(x / y) for y > 0: ``(x + y - 1) // y``, as triton.cdiv."""
    return (x + y - 1) // y


def next_pow2(n: int) -> int:
    """The smallest power of two >= n for n >= 1 (0 for n = 0), as triton.next_power_of_2."""
    return 1 << (n - 1).bit_length() if n > 0 else 0

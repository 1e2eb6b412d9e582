"""16x16 random Hadamard transform (NVFP4 recipe: applied to both wgrad operands along K).

``Q = diag(signs) @ H16 / 4`` with H16 the Sylvester Hadamard matrix and ``signs`` a seeded
random +-1 vector; ``Q Q^T = I``, so ``(A Q)(B Q)^T = A B^T``: transforming both operands of a
GEMM along its contraction dim leaves the product unchanged while spreading outliers over 16
elements before FP4 quantization. ``hadamard16(x, signs)`` transforms the last dim in blocks of
16 (it must divide by 16) in fp32, in a fixed order: signs (exact), the butterfly
``(a, b) -> (a + b, a - b)`` at strides 1, 2, 4, 8, then ``* 0.25`` (exact).
"""
from __future__ import annotations

import torch

__all__ = ["hadamard16", "random_signs", "hadamard16_matrix"]


def random_signs(seed: int, device=None) -> torch.Tensor:
    """16 random +-1 (fp32) from ``seed`` (CPU generator, so identical on every device)."""
    g = torch.Generator().manual_seed(int(seed))
    return (torch.randint(0, 2, (16,), generator=g) * 2 - 1).to(torch.float32).to(device)


def hadamard16_matrix(signs: torch.Tensor) -> torch.Tensor:
    """The 16x16 matrix Q with ``hadamard16(x) == x @ Q`` (up to rounding)."""
    return hadamard16(torch.eye(16, device=signs.device), signs)


def hadamard16(x: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    if x.shape[-1] % 16:
        raise ValueError(f"hadamard16 needs the last dim divisible by 16, got {tuple(x.shape)}")
    shape = x.shape
    y = x.to(torch.float32).reshape(-1, shape[-1] // 16, 16) * signs.to(x.device)
    h = 1
    while h < 16:
        y = y.reshape(y.shape[0], y.shape[1], 16 // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2)
        h *= 2
    return (y.reshape(shape) * 0.25)

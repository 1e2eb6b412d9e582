"""Scale granularity: which elements share one scale.

A ``Block(rows, cols)`` tiles the last two dimensions of a tensor; ``-1`` means the whole
dimension. Tensorwise is ``Block(-1, -1)`` with a 0-dim scale; any other block has a scale of shape
``(*lead, ceil(R / rows), ceil(C / cols))`` for data of shape ``(*lead, R, C)`` (a 1-D tensor is
treated as one row). A trailing partial block is allowed: its scale covers the elements that exist,
exactly as if the tensor were padded with zeros.

The block amax is taken over finite elements only (``|x|`` with NaN and +-inf counted as 0): NaN
is carried element by element (or in the block scale for FP4), +-inf saturates.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Block", "TENSOR", "ROW", "block_amax", "expand_scale", "finite_abs"]


@dataclass(frozen=True)
class Block:
    rows: int = -1
    cols: int = -1

    def __post_init__(self):
        for v in (self.rows, self.cols):
            if not (v == -1 or (isinstance(v, int) and v > 0)):
                raise ValueError(f"Block sizes are positive ints or -1 (whole dim), got {self}")

    @property
    def is_tensorwise(self) -> bool:
        return self.rows == -1 and self.cols == -1

    def t(self) -> "Block":
        """The block of the transposed tensor."""
        return Block(self.cols, self.rows)

    def sizes(self, shape) -> tuple[int, int]:
        """Concrete (rows, cols) block sizes for data of this shape."""
        R, C = _rc(shape)
        return (R if self.rows == -1 else self.rows, C if self.cols == -1 else self.cols)

    def scale_shape(self, shape) -> tuple[int, ...]:
        if self.is_tensorwise:
            return ()
        R, C = _rc(shape)
        br, bc = self.sizes(shape)
        lead = tuple(shape[:-2]) if len(shape) >= 2 else ()
        return lead + (-(-R // max(br, 1)) if R else 0, -(-C // max(bc, 1)) if C else 0)

    def __str__(self) -> str:
        if self.is_tensorwise:
            return "tensor"
        f = lambda v: "full" if v == -1 else str(v)  # noqa: E731
        return f"{f(self.rows)}x{f(self.cols)}"


TENSOR = Block(-1, -1)
ROW = Block(1, -1)


def _rc(shape) -> tuple[int, int]:
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return 1, shape[0]
    return shape[-2], shape[-1]


def finite_abs(x: torch.Tensor) -> torch.Tensor:
    """|x| in float32 with NaN and +-inf replaced by 0."""
    a = x.to(torch.float32).abs()
    return torch.where(torch.isfinite(a), a, torch.zeros_like(a))


def _as_blocks(x: torch.Tensor, block: Block, fill: float = 0.0) -> torch.Tensor:
    """View ``x`` (padded with ``fill``) as (*lead, nR, br, nC, bc)."""
    shape = tuple(x.shape)
    x2 = x.reshape(*(shape[:-2] if len(shape) >= 2 else ()), *_rc(shape))
    R, C = _rc(shape)
    br, bc = block.sizes(shape)
    nR, nC = -(-R // br), -(-C // bc)
    pad_r, pad_c = nR * br - R, nC * bc - C
    if pad_r or pad_c:
        x2 = torch.nn.functional.pad(x2, (0, pad_c, 0, pad_r), value=fill)
    return x2.reshape(*x2.shape[:-2], nR, br, nC, bc)


def block_amax(x: torch.Tensor, block: Block) -> torch.Tensor:
    """Max of the finite |x| over each block: shape ``block.scale_shape(x.shape)``."""
    a = finite_abs(x)
    if block.is_tensorwise:
        return a.amax() if a.numel() else torch.zeros((), device=x.device)
    if a.numel() == 0:
        return torch.zeros(block.scale_shape(x.shape), device=x.device)
    return _as_blocks(a, block).amax(dim=(-3, -1))


def block_any(mask: torch.Tensor, block: Block) -> torch.Tensor:
    """Whether any element of each block is set (bool, scale-shaped)."""
    if block.is_tensorwise:
        return mask.any()
    return _as_blocks(mask.to(torch.uint8), block).amax(dim=(-3, -1)).bool()


def expand_scale(scale: torch.Tensor, shape, block: Block) -> torch.Tensor:
    """Broadcast a scale-shaped tensor back to the element shape (repeat each block's scale)."""
    if block.is_tensorwise:
        return scale
    R, C = _rc(shape)
    br, bc = block.sizes(shape)
    s = scale.repeat_interleave(br, dim=-2)[..., :R, :] if br > 1 else scale
    s = s.repeat_interleave(bc, dim=-1)[..., :C] if bc > 1 else s
    return s.reshape(shape) if len(shape) < 2 else s

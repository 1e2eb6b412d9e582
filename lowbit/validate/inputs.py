"""Inputs of the kernel audit: random tensors and adversarial ones, reproducible from a seed.

``cast_input(kind, R, C, fmt, seed)`` (float32, (R, C)):

* ``"random"``: N(0, 1) with each row and column scaled by its own power of two in [2^-8, 2^8]
  (row, block and tensor scales all differ).
* ``"adversarial"``: every 16th column holds a *pin* ``+-fmax * 2^-4`` (``fmax`` of ``fmt``), so every
  block of every recipe (tensor, row, 1x128, 128x128, MX-32, NV-16) has amax ``fmax * 2^-4`` and the
  power-of-two scale ``2^-4`` (NV: within an fp32 rounding of it); between the pins, rows cycle
  through: the midpoints of consecutive values of ``fmt`` (ties, both signs, subnormal ones
  included), the subnormals of ``fmt`` and the values around half the smallest one (ties to zero,
  just above), the largest and smallest normals and their neighbours, NaN and +-inf (which
  saturate) among normal values, zeros of both signs (a row without pins: an all-zero
  block), fp32 subnormal inputs (a row without pins: a block whose scale is itself tiny), and values
  spread over the format's whole exponent range. (Saturation of finite values, which amax scaling
  never causes, comes from the random input under delayed scaling's first scale of 1 and MX's
  floor rule.)

``gemm_inputs(kind, M, N, K, seed)`` -> (x (M, K), w (N, K)) float32, for ``x @ w.t()``:

* ``"random"``: as above.
* ``"adversarial"``: rows of x and w cycle through: pairs that cancel (``x[2t] = x[2t+1]`` and
  ``w[2t] = -w[2t+1]``, so the exact product is 0 while ``|x| @ |w|`` is large), the same with a
  residual ``2^-20`` term, values scaled by ``2^50`` and ``2^-50`` (products stay inside fp32), fp32
  subnormals, zeros, a NaN element (that row's outputs must be NaN) and an inf element (saturates).
"""
from __future__ import annotations

import math

import torch

from ..dtypes.formats import Format

__all__ = ["CAST_KINDS", "GEMM_KINDS", "cast_input", "gemm_inputs", "PIN_EXP"]

CAST_KINDS = ("random", "adversarial")
GEMM_KINDS = ("random", "adversarial")
PIN_EXP = -4
_PIN_EVERY = 16


def _spread(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    R, C = x.shape
    r = torch.exp2(torch.randint(-8, 9, (R, 1), generator=g).float())
    c = torch.exp2(torch.randint(-8, 9, (1, C), generator=g).float())
    return x * r * c


def _cycle(vals: list, n: int) -> torch.Tensor:
    t = torch.tensor(vals, dtype=torch.float64)
    return t.repeat(-(-n // max(len(vals), 1)))[:n]


def _pos_values(fmt: Format) -> list:
    return sorted({v for v in fmt.values().tolist() if v >= 0})


def _rows(fmt: Format, g: torch.Generator, n: int) -> list:
    """Value rows (float64, scale 1) for the adversarial cast input, before pins and scaling."""
    pos = _pos_values(fmt)
    mids = [(a + b) / 2 for a, b in zip(pos, pos[1:])]
    sub = [v for v in pos if 0 < v < fmt.min_normal]
    tiny = fmt.min_subnormal
    edges = [fmt.max, fmt.min_normal, fmt.min_normal * (1 - 2.0 ** -(fmt.mbits + 2)),
             fmt.max * (1 - 2.0 ** -(fmt.mbits + 2)), tiny / 2, tiny / 2 * (1 + 2.0 ** -10), tiny / 4, tiny * 0.75]
    normal = torch.randn(n, generator=g, dtype=torch.float64).tolist()
    special = [math.nan if i % 7 == 1 else (math.inf if i % 7 == 3 else (-math.inf if i % 7 == 5 else v))
               for i, v in enumerate(normal)]
    e = torch.randint(fmt.emin - fmt.mbits - 2, fmt.emax, (n,), generator=g)  # below fmax: pins stay the amax
    wide = (torch.rand(n, generator=g, dtype=torch.float64) + 1) * torch.exp2(e.double())
    sign = torch.where(torch.arange(n) % 2 == 0, 1.0, -1.0).double()
    return [("ties", _cycle(mids, n) * sign), ("subnormals", _cycle(sub + [tiny / 2, tiny * 0.75], n) * sign),
            ("edges", _cycle(edges, n) * sign), ("nan-inf", torch.tensor(special, dtype=torch.float64)),
            ("wide", wide * sign)]


def cast_input(kind: str, R: int, C: int, fmt: Format, seed: int = 0) -> torch.Tensor:
    """The ``kind`` input of the cast checks (module docstring), float32 (R, C)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        return _spread(torch.randn(R, C, generator=g), g)
    if kind != "adversarial":
        raise ValueError(f"unknown cast input kind {kind!r}; one of {CAST_KINDS}")
    out = torch.empty(R, C, dtype=torch.float64)
    rows = _rows(fmt, g, C)
    pin = fmt.max * 2.0 ** PIN_EXP
    for i in range(R):
        which = i % (len(rows) + 2)
        if which == len(rows):  # zeros of both signs, no pin: an all-zero block
            out[i] = torch.where(torch.arange(C) % 2 == 0, 0.0, -0.0).double()
            continue
        if which == len(rows) + 1:  # fp32 subnormal inputs, no pin
            out[i] = torch.randint(1, 1 << 23, (C,), generator=g).double() * 2.0 ** -149
            continue
        out[i] = rows[which][1] * 2.0 ** PIN_EXP
        out[i, ::_PIN_EVERY] = torch.where(torch.arange(0, C, _PIN_EVERY) % 32 == 0, pin, -pin).double()
    return out.to(torch.float32)


def gemm_inputs(kind: str, M: int, N: int, K: int, seed: int = 0):
    """(x (M, K), w (N, K)) float32 of the GEMM checks (module docstring)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        return _spread(torch.randn(M, K, generator=g), g), _spread(torch.randn(N, K, generator=g), g)
    if kind != "adversarial":
        raise ValueError(f"unknown GEMM input kind {kind!r}; one of {GEMM_KINDS}")
    return _adversarial_operand(M, K, g, +1), _adversarial_operand(N, K, g, -1)


def _adversarial_operand(R: int, K: int, g: torch.Generator, pair_sign: int) -> torch.Tensor:
    out = torch.empty(R, K, dtype=torch.float64)
    half = -(-K // 2)
    for i in range(R):
        which = i % 8
        base = torch.randn(half, generator=g, dtype=torch.float64)
        pairs = torch.stack([base, pair_sign * base], 1).flatten()[:K]  # x: (b, b); w: (b, -b)
        if which in (0, 1):
            out[i] = pairs
            if which == 1:
                out[i, -1] = 2.0 ** -20
        elif which == 2:
            out[i] = pairs * 2.0 ** 50
        elif which == 3:
            out[i] = pairs * 2.0 ** -50
        elif which == 4:
            out[i] = torch.randint(1, 1 << 23, (K,), generator=g).double() * 2.0 ** -149
        elif which == 5:
            out[i] = torch.where(torch.arange(K) % 3 == 0, 0.0, -0.0).double()
        elif which == 6:
            out[i] = torch.randn(K, generator=g, dtype=torch.float64)
            out[i, K // 2] = math.nan if pair_sign > 0 else math.inf
        else:
            out[i] = torch.randn(K, generator=g, dtype=torch.float64) * torch.exp2(
                torch.randint(-20, 21, (K,), generator=g).double())
    return out.to(torch.float32)

"""The columns of a statistics row (one row per watched tensor and step, float64), and the
saturation limit a cast's row counts against: what both the torch reduction (``stats``) and the
Triton one (``stats_kernel``) write."""
from __future__ import annotations

import numpy as np

__all__ = ["COLUMNS", "COL", "WIDTH", "saturation_limit"]

COLUMNS = ("nonfinite", "amax", "saturated", "underflow", "nonzero", "numel", "seq", "scale", "signal",
           "noise", "calls")
COL = {name: i for i, name in enumerate(COLUMNS)}
WIDTH = len(COLUMNS)


def saturation_limit(fmt) -> float:
    """The largest ``|y|`` that round-to-nearest-even still puts on ``fmt``'s grid (at most
    ``fmax``): ``fmax + ulp / 2`` when that tie rounds down to ``fmax`` (its mantissa is even),
    the fp32 number below it when the tie rounds up (E5M2, E2M1). Above it, the cast saturates."""
    ulp = 2.0 ** (fmt.emax - fmt.mbits)
    lim = np.float32(fmt.max + ulp / 2)
    if int(fmt.max / ulp) % 2:
        lim = np.nextafter(lim, np.float32(0))
    return float(lim)

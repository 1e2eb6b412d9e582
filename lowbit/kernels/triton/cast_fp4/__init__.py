"""FP4 (E2M1) casts (Triton), one place: the kernels (``kernels``: MX-32 and NV-16, 2-D tiles and
the row-local walk; ``pairs``: the row-local walk on bf16 pairs; ``e2m1``: the encoders) and the
launcher (``launch``); the tuning table is the FP8 casts' (``cast_fp8.tuning``)."""
from .launch import FP4Casts

__all__ = ["FP4Casts"]

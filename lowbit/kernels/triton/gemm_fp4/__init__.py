"""FP4 GEMMs on Hopper (Triton), one place: FP4 x FP4 (``mm``), bf16 x FP4 weight-only
(``weight_only``), the exact in-kernel decode (``decode``), the launcher (``launch``) and the
tuning table (``tuning``)."""
from .launch import FP4Gemm
from .tuning import GEMM_FP4_TUNING, GemmFP4Tuning

__all__ = ["FP4Gemm", "GemmFP4Tuning", "GEMM_FP4_TUNING"]

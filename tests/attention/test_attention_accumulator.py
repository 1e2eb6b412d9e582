"""The emulation's tensor-core accumulator model (``attention_emulation.tensor_core_mm``), against
which benchmarks/attention.py judges the kernels on an H100/H200: lowbit's hardware audit
(``lowbit.validate.hardware``), run on the model, measures what it measured on the H200 (14 bits
kept by truncation, nothing kept across a chain's end but what the fp32 promotion adds); without
a model the sums are exact; the model's error stays inside the analytic tensor-core bound
(``lowbit.validate.metrics.tensor_core_bound``); and only the torch backend takes a model."""
import pytest
import torch

from lowbit.dtypes.formats import E4M3
from lowbit.kernels.attention import attention_forward
from lowbit.kernels.attention_emulation import quantize_tokens, tensor_core_mm
from lowbit.scaling import AttentionRecipe
from lowbit.validate.attention_baseline import outlier_inputs
from lowbit.validate.hardware import probe_bits, probe_promotion
from lowbit.validate.metrics import HOPPER_FP8, tensor_core_bound

CHAIN = 128  # a kernel tile: each product restarts from zero, the tiles are added in fp32


def _tiled(accumulator):
    def mm(A, B):
        return sum(tensor_core_mm(A[:, c:c + CHAIN], B[c:c + CHAIN], accumulator)
                   for c in range(0, A.shape[1], CHAIN)).float()
    return mm


@pytest.mark.parametrize("far", [False, True])
def test_hardware_audit_of_the_model(far):
    """The small product right after the big one (``far``: a group later) is lost at 14 bits, and
    0.75 of the last kept bit is dropped, not rounded up: truncation, as the H200 measured."""
    assert probe_bits(_tiled(HOPPER_FP8), E4M3, K=64, far=far) == {"bits": 14, "rounding": "truncation",
                                                                   "at_least": False}
    assert probe_bits(_tiled(None), E4M3, K=64, far=far)["at_least"]  # exact sums keep every bit


def test_promotion_interval_is_the_tile():
    """2^16 then 511 products of 2^-6: the model loses the big product's chain (127 of them) and
    keeps the three chains started from zero, so the audit reads a promotion every 128 products."""
    got = probe_promotion(_tiled(HOPPER_FP8), E4M3, K=512)
    assert got["interval"] == CHAIN and got["survivors"] == 512 - CHAIN


def test_model_error_within_the_tensor_core_bound():
    """E4M3 codes of outlier data, one 128-long chain: |model - exact| <= tensor_core_bound, and the
    model is not exact (so the bound is not met trivially)."""
    a, b = (quantize_tokens(t[None, None], 0)[0][0, 0] for t in outlier_inputs([(48, CHAIN), (CHAIN, 40)], seed=2))
    exact = tensor_core_mm(a, b)
    err = (tensor_core_mm(a, b, HOPPER_FP8) - exact).abs()
    bound = tensor_core_bound(a, b, HOPPER_FP8)
    assert bool((err <= bound).all()) and float(err.max()) > 0
    assert float((err / bound).max()) > 0.01  # the bound is within two decades of the error somewhere


def test_only_the_torch_backend_takes_a_model():
    q, k, v = outlier_inputs([(1, 1, 8, 16)] * 3)
    with pytest.raises(ValueError, match="accumulator"):
        attention_forward(q, k, v, scale=0.25, recipe=AttentionRecipe(), backend="triton", accumulator=HOPPER_FP8)

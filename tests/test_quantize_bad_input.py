"""Bad and awkward input to quantize / dequantize / pack_fp4: clear errors, or the right answer.

Errors: non-float dtypes (TypeError naming the dtype), float8/float4 input, non-tensors, formats
quantize does not target (E8M0, UE4M3, FP16, unknown names), E2M1 without saturation, unknown
rounding modes, odd last dims for pack_fp4, wrong code dtypes for dequantize.
Handled: NaN/Inf, all zeros, empty tensors, non-contiguous views, fp16/bf16/fp64 input, broadcast scales.
"""
import math

import pytest
import torch

from lowbit.dtypes.formats import BF16, E2M1, E4M3, E5M2, E8M0, FP16, UE4M3
from lowbit.dtypes.quantize import dequantize, pack_fp4, quantize, unpack_fp4

FORMATS = (E4M3, E5M2, E2M1)
ids = lambda f: f.name  # noqa: E731


def codes(q, fmt):
    return q.view(torch.uint8) if fmt.torch_dtype is not None else q


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool,
                                   torch.complex64])
def test_non_float_dtype_is_a_type_error_naming_the_dtype(dtype):
    x = torch.zeros(4, dtype=dtype)
    with pytest.raises(TypeError, match=str(dtype).replace(".", r"\.")):
        quantize(x, E4M3, 1.0)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
                                   torch.float8_e5m2fnuz, torch.float8_e8m0fnu])
def test_float8_input_is_a_type_error(dtype):
    x = torch.ones(4).to(dtype)
    with pytest.raises(TypeError, match=str(dtype).replace(".", r"\.")):
        quantize(x, E4M3, 1.0)


def test_float4_and_non_tensor_input_are_type_errors():
    with pytest.raises(TypeError, match="float4_e2m1fn_x2"):
        quantize(torch.zeros(4, dtype=torch.uint8).view(torch.float4_e2m1fn_x2), E2M1, 1.0)
    with pytest.raises(TypeError, match="list"):
        quantize([1.0, 2.0], E4M3, 1.0)


@pytest.mark.parametrize("fmt", [E8M0, UE4M3, FP16, BF16, "e8m0", "fp32"], ids=str)
def test_formats_quantize_does_not_target(fmt):
    with pytest.raises(ValueError, match="quantize targets"):
        quantize(torch.ones(4), fmt, 1.0)


def test_unknown_format_and_rounding():
    with pytest.raises(ValueError, match="unknown format"):
        quantize(torch.ones(4), "e3m4", 1.0)
    with pytest.raises(ValueError, match="rounding"):
        quantize(torch.ones(4), E4M3, 1.0, rounding="rtz")


def test_e2m1_without_saturation_is_refused():
    with pytest.raises(ValueError, match="saturate"):
        quantize(torch.ones(4), E2M1, 1.0, saturate=False)
    with pytest.raises(ValueError, match="saturate"):
        quantize(torch.ones(4), "e2m1", 1.0, rounding="stochastic", saturate=False)


def test_pack_fp4_errors():
    with pytest.raises(ValueError, match="even last dimension"):
        pack_fp4(torch.zeros(3, 5, dtype=torch.uint8))
    with pytest.raises(ValueError, match="even last dimension"):
        pack_fp4(torch.zeros(7, dtype=torch.uint8))
    with pytest.raises(TypeError, match="int64"):
        pack_fp4(torch.zeros(4, dtype=torch.int64))
    with pytest.raises(TypeError, match="float32"):
        unpack_fp4(torch.zeros(4))


def test_dequantize_checks_the_code_dtype():
    with pytest.raises(TypeError, match="float8_e5m2"):
        dequantize(torch.ones(4).to(torch.float8_e5m2), E4M3, 1.0)
    with pytest.raises(TypeError, match="uint8"):
        dequantize(torch.ones(4, dtype=torch.int32), E2M1, 1.0)


# ------------------------------------------------------------------ handled correctly
@pytest.mark.parametrize("fmt", FORMATS, ids=ids)
def test_nan_and_inf(fmt):
    x = torch.tensor([math.nan, math.inf, -math.inf, 1.0])
    q = quantize(x, fmt, 1.0)
    v = fmt.decode(codes(q, fmt))
    assert v[1:].tolist() == [fmt.max, -fmt.max, 1.0]  # inf saturates (never a silent inf/NaN)
    if fmt.has_nan:
        assert math.isnan(v[0])
    else:
        assert int(q[0]) == 0  # E2M1: no NaN code; the caller carries NaN in the scale
    assert math.isnan(float(dequantize(q, fmt, math.nan)[3]))  # a NaN scale propagates


@pytest.mark.parametrize("fmt", FORMATS, ids=ids)
def test_all_zeros_keep_their_sign(fmt):
    x = torch.zeros(3, 16)
    x[1] = -0.0
    q = codes(quantize(x, fmt, 0.125), fmt)
    neg = 1 << (fmt.ebits + fmt.mbits)
    assert torch.equal(q[0], torch.zeros(16, dtype=torch.uint8)) and bool((q[1] == neg).all())
    assert torch.equal(dequantize(quantize(x, fmt, 0.125), fmt, 0.125), x)


@pytest.mark.parametrize("fmt", FORMATS, ids=ids)
@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4)])
def test_empty(fmt, shape):
    x = torch.empty(shape)
    q = quantize(x, fmt, 1.0)
    assert q.shape == x.shape and q.dtype == (fmt.torch_dtype or torch.uint8)
    assert dequantize(q, fmt, 1.0).shape == x.shape
    if fmt is E2M1 and shape[-1] % 2 == 0:
        assert pack_fp4(q).shape == shape[:-1] + (shape[-1] // 2,)
        assert unpack_fp4(pack_fp4(q)).shape == shape
    assert quantize(x, fmt, 1.0, rounding="stochastic").shape == x.shape


@pytest.mark.parametrize("fmt", FORMATS, ids=ids)
def test_non_contiguous_input_and_scale(fmt):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(24, 32, generator=g) * 3
    s_rows = torch.rand(32, 1, generator=g) + 0.1
    for x in (base.t(), base[:, ::2], base[::3, 1::3], base.t()[::2]):
        s = s_rows[: x.shape[0]]
        assert not x.is_contiguous()
        assert torch.equal(codes(quantize(x, fmt, 0.37), fmt), codes(quantize(x.contiguous(), fmt, 0.37), fmt))
        assert torch.equal(codes(quantize(x, fmt, s), fmt), codes(quantize(x.contiguous(), fmt, s), fmt))
    c = codes(quantize(base, E2M1, 1.0), E2M1)
    assert torch.equal(pack_fp4(c.t()), pack_fp4(c.t().contiguous()))
    assert torch.equal(unpack_fp4(pack_fp4(c)[:, ::2]), unpack_fp4(pack_fp4(c)[:, ::2].contiguous()))


@pytest.mark.parametrize("fmt", FORMATS, ids=ids)
def test_half_and_double_inputs(fmt):
    """fp16/bf16 are exact in fp32; fp64 is rounded to fp32 first (quantize's ``fp32(x) / fp32(scale)``)."""
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 4
    for dt in (torch.float16, torch.bfloat16, torch.float64):
        xd = x.to(dt)
        assert torch.equal(codes(quantize(xd, fmt, 0.5), fmt), codes(quantize(xd.float(), fmt, 0.5), fmt))
    # scale given as a Python float, a 0-dim tensor of any float dtype, or a broadcasting tensor: same codes
    ref = codes(quantize(x.float(), fmt, 0.3), fmt)
    for s in (torch.tensor(0.3), torch.tensor(0.3, dtype=torch.float64), torch.full((1000,), 0.3)):
        assert torch.equal(codes(quantize(x.float(), fmt, s), fmt), ref)


def test_requires_grad_input_is_accepted():
    x = torch.randn(8, requires_grad=True)
    assert torch.equal(quantize(x, E4M3, 1.0).view(torch.uint8), quantize(x.detach(), E4M3, 1.0).view(torch.uint8))
    assert torch.equal(quantize(x, E2M1, 1.0), quantize(x.detach(), E2M1, 1.0))

"""FP8Tensor / FP4Tensor as PyTorch tensors: metadata, dequantize, subclass protocol, _to_copy.

* ``from_float`` keeps the logical shape and reports the original dtype; scales have the
  granularity's shape and dtype (fp32, E8M0 for MX, E4M3 for NV + an fp32 global scale).
* ``dequantize(float64)`` is exactly ``value(q) * scale`` (times the NV global scale).
* ``__tensor_flatten__`` / ``__tensor_unflatten__`` rebuild an identical tensor.
* ``_to_copy``: a float dtype changes only the reported/dequantized dtype; cpu -> cpu keeps the
  payload; integer or float8 targets are TypeErrors.
"""
import pytest
import torch

from lowbit.dtypes import E2M1, FP4Tensor, FP8Tensor
from lowbit.scaling import expand_scale
from lowbit_cases import FP4_NAMES, FP8_NAMES, GRANULARITIES, NAMES, assert_same_lowbit, bits, quantized, sample

SCALE_DTYPES = {"tensor": torch.float32, "tensor-e5m2": torch.float32, "row": torch.float32,
                "1x128": torch.float32, "128x128": torch.float32, "mx-fp8": torch.float8_e8m0fnu,
                "mx-fp4": torch.float8_e8m0fnu, "nv-1x16": torch.float8_e4m3fn, "nv-16x16": torch.float8_e4m3fn}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_metadata(name, dtype):
    cls, recipe, role = GRANULARITIES[name]
    q = quantized(name, dtype=dtype)
    assert isinstance(q, cls) and q.shape == (20, 136) and q.dtype == dtype and q.device.type == "cpu"
    assert not q.requires_grad
    assert q.block == recipe.granularity(role)
    assert q._scale.dtype == SCALE_DTYPES[name]
    assert tuple(q._scale.shape) == q.block.scale_shape(q.shape)
    assert q.dequantize().dtype == dtype and q.dequantize(torch.float64).dtype == torch.float64
    assert cls.__name__ in repr(q)
    if cls is FP4Tensor:
        assert q._qdata.dtype == torch.uint8 and q._qdata.shape == (20, 68)
        assert q._global_scale.dtype == torch.float32 and q._global_scale.dim() == 0
    else:
        assert q._data.dtype == recipe.format(role).torch_dtype and q._data.shape == (20, 136)


@pytest.mark.parametrize("name", NAMES)
def test_three_dim_input_has_leading_scale_dims(name):
    """Each leading index is quantized as its own 2-D tensor (same tensor amax in both halves, so
    the tensorwise and NV global scales agree too)."""
    x = sample((2, 10, 136))
    x[:, 0, 0] = 1000.0
    x3 = quantized(name, x=x)
    x2s = [quantized(name, x=x[i]) for i in range(2)]
    assert x3.shape == (2, 10, 136)
    if not x3.block.is_tensorwise:  # blocks tile the last two dims of each leading index
        assert x3._scale.shape[0] == 2
    for i in range(2):
        assert torch.equal(bits(x3.dequantize()[i]), bits(x2s[i].dequantize()))


@pytest.mark.parametrize("name", FP8_NAMES)
def test_fp8_dequantize_is_value_times_scale(name):
    q = quantized(name)
    s = expand_scale(q.scale_fp32().to(torch.float64), q.shape, q.block)
    assert torch.equal(q.dequantize(torch.float64), q._data.to(torch.float64) * s)
    assert torch.equal(q.dequantize(torch.float32), (q._data.to(torch.float64) * s).to(torch.float32))


@pytest.mark.parametrize("name", FP4_NAMES)
def test_fp4_dequantize_is_value_times_scales(name):
    q = quantized(name)
    s = expand_scale(q.block_scale_fp32().to(torch.float64), q.shape, q.block)
    want = E2M1.decode(q.codes()).to(torch.float64) * s * q._global_scale.to(torch.float64)
    assert torch.equal(q.dequantize(torch.float64), want)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("transpose", [False, True])
def test_flatten_unflatten_round_trip(name, transpose):
    q = quantized(name)
    q = q.t() if transpose else q
    names, meta = q.__tensor_flatten__()
    r = type(q).__tensor_unflatten__({n: getattr(q, n) for n in names}, meta, q.shape, q.stride())
    assert_same_lowbit(r, q)
    assert r.shape == q.shape


@pytest.mark.parametrize("name", NAMES)
def test_to_copy_dtype_and_device(name):
    q = quantized(name)
    b = q.to(torch.bfloat16)
    assert type(b) is type(q) and b.dtype == torch.bfloat16
    assert torch.equal(b.dequantize(), q.dequantize(torch.bfloat16))
    assert torch.equal(bits(b.dequantize(torch.float32)), bits(q.dequantize()))  # payload untouched
    c = q.to("cpu", copy=True)
    assert_same_lowbit(c, q)
    d = q.to(device="cpu", dtype=torch.float64)
    assert d.dtype == torch.float64 and torch.equal(d.dequantize(), q.dequantize(torch.float64))


@pytest.mark.parametrize("name", ["tensor", "mx-fp4"])
@pytest.mark.parametrize("bad", [torch.int32, torch.bool, torch.float8_e4m3fn])
def test_to_copy_refuses_non_float_targets(name, bad):
    with pytest.raises(TypeError, match="dequantize"):
        quantized(name).to(bad)


def test_constructor_checks_payload_dtypes():
    with pytest.raises(TypeError, match="float8"):
        FP8Tensor(torch.zeros(2, 2), torch.ones(()))
    with pytest.raises(TypeError, match="uint8"):
        FP4Tensor(torch.zeros(2, 2), torch.ones(1, 1).to(torch.float8_e8m0fnu), torch.ones(()), quantized("mx-fp4").block)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        FP4Tensor(torch.zeros(2, 2, dtype=torch.uint8), torch.ones(1, 1), torch.ones(()),
                  quantized("nv-1x16").block, kind="nv")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("transpose", [False, True])
def test_public_accessors_are_what_dequantize_uses_and_read_only(name, transpose):
    """``qdata`` / ``scale`` (and FP4's ``global_scale``, ``transposed``): the payload as stored,
    copies: writing into them, or assigning them, leaves the tensor as it was."""
    from lowbit.dtypes.quantize import unpack_fp4
    q = quantized(name)
    q = q.t() if transpose else q
    want = q.dequantize(torch.float64)
    if isinstance(q, FP8Tensor):
        assert q.qdata.shape == q.shape and q.qdata.dtype == q.fmt.torch_dtype
        s = expand_scale(q.scale.to(torch.float64), q.shape, q.block)
        got = q.qdata.to(torch.float64) * s
        names = ("qdata", "scale")
    else:
        assert q.qdata.dtype == torch.uint8 and q.transposed == transpose
        stored = q.block.t() if q.transposed else q.block  # qdata / scale: the orientation quantized
        vals = E2M1.decode(unpack_fp4(q.qdata)).to(torch.float64)
        got = vals * expand_scale(q.scale.to(torch.float64), vals.shape, stored) * q.global_scale.to(torch.float64)
        got = got.t() if q.transposed else got
        names = ("qdata", "scale", "global_scale")
    assert torch.equal(got, want)
    for n in names:
        getattr(q, n).untyped_storage().fill_(0x41)  # every byte of what the accessor returned
        with pytest.raises(AttributeError):
            setattr(q, n, getattr(q, n))
    assert torch.equal(q.dequantize(torch.float64), want)

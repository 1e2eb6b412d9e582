"""The aten ops tables of FP8Tensor / FP4Tensor (lowbit/dtypes/ops.py).

* detach / alias share the payload, clone copies it; both keep every bit.
* t / transpose swap metadata, never requantize: ``t().dequantize() == dequantize().t()`` bit for
  bit for every granularity (FP4: a ``transposed`` flag), and the FP8 payload is a view.
* view / reshape where legal (tensorwise: anything; 1 x c blocks: keep the last dim; other blocks
  and FP4: keep the last two dims), NotImplementedError saying why where not.
* any other op: NotImplementedError naming the op.
"""
import pytest
import torch

from lowbit.dtypes import FP8Tensor
from lowbit_cases import FP4_NAMES, FP8_NAMES, NAMES, assert_same_lowbit, bits, payload, quantized


def deq_bits(q):
    return bits(q.dequantize())


@pytest.mark.parametrize("name", NAMES)
def test_detach_alias_clone(name):
    q = quantized(name)
    d, c = q.detach(), q.clone()
    assert_same_lowbit(d, q)
    assert_same_lowbit(c, q)
    for k, v in payload(q).items():
        assert payload(d)[k].data_ptr() == v.data_ptr()        # detach: a view
        assert payload(c)[k].data_ptr() != v.data_ptr() or v.numel() == 0  # clone: a copy
    a = torch.ops.aten.alias.default(q)
    assert_same_lowbit(a, q)


@pytest.mark.parametrize("name", NAMES)
def test_transpose_swaps_metadata_exactly(name):
    q = quantized(name)
    for qt in (q.t(), q.transpose(0, 1), q.transpose(-1, -2), torch.t(q)):
        assert qt.shape == (136, 20) and type(qt) is type(q)
        assert torch.equal(deq_bits(qt), bits(q.dequantize().t()))
        assert qt.block == q.block.t()
        assert_same_lowbit(qt.t(), q)
    qt = q.t()
    if isinstance(q, FP8Tensor):  # same bytes, no requantization
        assert qt._data.data_ptr() == q._data.data_ptr() and qt._data.stride() == q._data.stride()[::-1]
    else:
        assert qt._transposed and not q._transposed and qt._qdata.data_ptr() == q._qdata.data_ptr()
        assert torch.equal(qt.codes(), q.codes().t())


@pytest.mark.parametrize("name", FP8_NAMES)
def test_fp8_transpose_of_3d_last_two_dims(name):
    q = quantized(name, shape=(2, 20, 136))
    assert torch.equal(deq_bits(q.transpose(-2, -1)), bits(q.dequantize().transpose(-2, -1)))
    with pytest.raises(NotImplementedError, match="last two dims"):
        q.transpose(0, 1)


@pytest.mark.parametrize("name", FP4_NAMES)
def test_fp4_transpose_needs_2d(name):
    with pytest.raises(NotImplementedError, match="2-D"):
        quantized(name, shape=(2, 4, 32)).transpose(-2, -1)


# ---- view / reshape -----------------------------------------------------------------------------
LEGAL = {  # name -> shapes reachable from (2, 10, 136) by view/reshape
    "tensor": [(20, 136), (2720,), (4, 5, 136), (40, 68), (-1, 8)],
    "tensor-e5m2": [(20, 136), (2720,)],
    "row": [(20, 136), (4, 5, 136), (-1, 136)],
    "1x128": [(20, 136), (5, 4, 136)],
    "mx-fp8": [(20, 136), (1, 20, 136)],
    "128x128": [(1, 2, 10, 136), (2, 10, 136)],
    "mx-fp4": [(1, 2, 10, 136), (2, 1, 10, 136)],
    "nv-1x16": [(1, 2, 10, 136)],
    "nv-16x16": [(1, 2, 10, 136)],
}
ILLEGAL = {
    "tensor": [],
    "tensor-e5m2": [],
    "row": [(10, 272), (2720,)],
    "1x128": [(2, 20, 68)],
    "mx-fp8": [(2720,), (2, 5, 272)],
    "128x128": [(20, 136), (2, 136, 10)],
    "mx-fp4": [(20, 136), (2, 5, 272)],
    "nv-1x16": [(20, 136), (2720,)],
    "nv-16x16": [(20, 136), (10, 2, 136)],
}


@pytest.mark.parametrize("name", NAMES)
def test_view_reshape_where_legal(name):
    q = quantized(name, shape=(2, 10, 136))
    ref = q.dequantize()
    for shape in LEGAL[name]:
        for op in (lambda t: t.view(shape), lambda t: t.reshape(shape)):
            v = op(q)
            assert type(v) is type(q) and v.shape == ref.reshape(shape).shape
            assert torch.equal(deq_bits(v), bits(ref.reshape(shape)))
            assert torch.equal(deq_bits(v.reshape(q.shape)), bits(ref))  # and back


@pytest.mark.parametrize("name", [n for n in NAMES if ILLEGAL[n]])
def test_view_that_splits_a_block_is_refused(name):
    q = quantized(name, shape=(2, 10, 136))
    for shape in ILLEGAL[name]:
        with pytest.raises(NotImplementedError, match="dequantize first"):
            q.view(shape)
        with pytest.raises(NotImplementedError, match="dequantize first"):
            q.reshape(shape)


@pytest.mark.parametrize("name", FP4_NAMES)
def test_fp4_transposed_view(name):
    qt = quantized(name).t()
    assert torch.equal(deq_bits(qt.view(136, 20)), deq_bits(qt))
    with pytest.raises(NotImplementedError, match="dequantize first"):
        qt.view(1, 136, 20)


# ---- everything else fails loudly, naming the op -----------------------------------------------
UNKNOWN = [
    (lambda q: torch.add(q, q), "aten.add"),
    (lambda q: q * 2, "aten.mul"),
    (lambda q: torch.sum(q), "aten.sum"),
    (lambda q: q.abs(), "aten.abs"),
    (lambda q: torch.cat([q, q]), "aten.cat"),
    (lambda q: q[0], "aten.select"),
    (lambda q: q.fill_(0.0), "aten.fill_"),
]


@pytest.mark.parametrize("name", ["tensor", "128x128", "mx-fp8", "mx-fp4", "nv-16x16"])
@pytest.mark.parametrize("case", range(len(UNKNOWN)))
def test_unknown_op_names_the_op(name, case):
    fn, op = UNKNOWN[case]
    q = quantized(name)
    with pytest.raises(NotImplementedError, match=op) as e:
        fn(q)
    assert type(q).__name__ in str(e.value) and "dequantize" in str(e.value)


def test_is_same_size():
    q = quantized("tensor")
    assert torch.ops.aten.is_same_size.default(q, q.clone())
    assert not torch.ops.aten.is_same_size.default(q, q.t())

"""Shared test inputs: one quantized example per scale granularity, and a bitwise comparison.

Granularities (name -> tensor class, recipe, role): FP8 tensorwise / rowwise / 1x128 / 128x128 /
MX-32 (E8M0), FP4 MX-32 and NV 1x16 / 16x16 (weight). The default shape (20, 136) has a partial
block along both dims for every blocked granularity.
"""
import torch

from lowbit.dtypes import FP4Tensor, FP8Tensor
from lowbit.scaling import MX, NV, Blockwise, Current, Rowwise

GRANULARITIES = {
    "tensor": (FP8Tensor, Current(), "input"),
    "tensor-e5m2": (FP8Tensor, Current(), "grad"),
    "row": (FP8Tensor, Rowwise(), "input"),
    "1x128": (FP8Tensor, Blockwise(), "input"),
    "128x128": (FP8Tensor, Blockwise(), "weight"),
    "mx-fp8": (FP8Tensor, MX(), "input"),
    "mx-fp4": (FP4Tensor, MX(elem="e2m1"), "input"),
    "nv-1x16": (FP4Tensor, NV(), "input"),
    "nv-16x16": (FP4Tensor, NV(), "weight"),
}
NAMES = list(GRANULARITIES)
FP8_NAMES = [n for n in NAMES if GRANULARITIES[n][0] is FP8Tensor]
FP4_NAMES = [n for n in NAMES if GRANULARITIES[n][0] is FP4Tensor]


def sample(shape=(20, 136), dtype=torch.float32, seed=0) -> torch.Tensor:
    """Random values spread over a few binades per row (so row/block scales differ)."""
    g = torch.Generator().manual_seed(seed)
    rows = shape[-2] if len(shape) > 1 else 1
    mag = torch.exp2(torch.randint(-6, 6, (rows, 1), generator=g).float())
    x = torch.randn(shape, generator=g) * (mag if len(shape) > 1 else mag[0])
    return x.to(dtype)


def quantized(name: str, shape=(20, 136), dtype=torch.float32, seed=0, x=None):
    cls, recipe, role = GRANULARITIES[name]
    x = sample(shape, dtype, seed) if x is None else x
    return cls.from_float(x, recipe, role)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a tensor's values (any dtype), in logical order."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def payload(q):
    """Inner tensors of a lowbit tensor, by name."""
    names, _ = q.__tensor_flatten__()
    return {n: getattr(q, n) for n in names}


def assert_same_lowbit(a, b, same_strides=True):
    """Same class, shape, dtype, metadata, and every inner tensor equal byte for byte."""
    assert type(a) is type(b) and a.shape == b.shape and a.dtype == b.dtype
    assert a.__tensor_flatten__()[1] == b.__tensor_flatten__()[1]
    pa, pb = payload(a), payload(b)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert pa[k].dtype == pb[k].dtype and pa[k].shape == pb[k].shape, k
        assert torch.equal(bits(pa[k]), bits(pb[k])), k
        if same_strides:
            assert pa[k].stride() == pb[k].stride(), k
    assert torch.equal(bits(a.dequantize()), bits(b.dequantize()))

"""torch.save / torch.load(weights_only=True) round trips of lowbit tensors, bit for bit.

Every granularity (FP8 tensor / row / 1x128 / 128x128 / MX; FP4 MX / NV 1x16 / NV 16x16), also
transposed, in bf16, and inside a state_dict next to a DelayedScalingState: the loaded tensor has
the same class, metadata (block, kind, transposed flag, original dtype) and payload bytes (data,
scales, global scale, strides).
"""
import io

import pytest
import torch

from lowbit.scaling import Delayed, DelayedScalingState
from lowbit_cases import NAMES, assert_same_lowbit, quantized


def round_trip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("variant", ["plain", "transposed", "bf16"])
def test_save_load_bitwise(name, variant):
    q = quantized(name, dtype=torch.bfloat16 if variant == "bf16" else torch.float32)
    q = q.t() if variant == "transposed" else q
    r = round_trip(q)
    assert_same_lowbit(r, q)
    assert r.stride() == q.stride()


def test_state_dict_with_every_granularity_and_delayed_state():
    st = DelayedScalingState(Delayed(history_len=3), "e4m3")
    st.update(torch.tensor(3.5))
    sd = {f"layers.{i}.{n}": quantized(n, seed=i) for i, n in enumerate(NAMES)}
    sd.update({f"scaling.{k}": v for k, v in st.state_dict().items()})
    sd["bias"] = torch.randn(5)
    out = round_trip(sd)
    assert list(out) == list(sd)
    for k, v in sd.items():
        if k.startswith("layers."):
            assert_same_lowbit(out[k], v)
        else:
            assert type(out[k]) is torch.Tensor and torch.equal(out[k], v)
    st2 = DelayedScalingState(Delayed(history_len=3), "e4m3")
    st2.load_state_dict({k[len("scaling."):]: v for k, v in out.items() if k.startswith("scaling.")})
    assert torch.equal(st2.scale, st.scale) and torch.equal(st2.amax_history, st.amax_history)


def test_loaded_tensor_still_works():
    """The loaded tensors are usable: transpose, matmul and dequantize give the same bits."""
    a, w = quantized("1x128", shape=(4, 136)), quantized("128x128", shape=(6, 136))
    ra, rw = round_trip([a, w])
    assert torch.equal(ra @ rw.t(), a @ w.t())

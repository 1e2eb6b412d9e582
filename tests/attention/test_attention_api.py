"""``lowbit.nn.functional.scaled_dot_product_attention``: torch's signature and layout, the output
in the input's dtype, gradients; clear errors for what torch rejects too; one warning and torch's
SDPA for what FP8 attention does not compute (masks, dropout, head dims, float64); the window and
the packed-sequence function."""
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from lowbit.kernels.attention_emulation import visible
from lowbit.nn.functional import scaled_dot_product_attention as sdpa
from lowbit.nn.functional import scaled_dot_product_attention_varlen as sdpa_varlen
from lowbit.scaling import AttentionRecipe
from lowbit.validate.attention_baseline import outlier_inputs, rel


def _qkv(hq=2, hkv=2, s=24, d=32, dtype=torch.float32, b=1):
    return outlier_inputs([(b, hq, s, d), (b, hkv, s, d), (b, hkv, s, d)], dtype=dtype)


def test_dtype_layout_and_gradients():
    q, k, v = (t.requires_grad_() for t in _qkv(hq=4, hkv=2, dtype=torch.bfloat16))
    out = sdpa(q, k, v, is_causal=True, enable_gqa=True)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True)
    assert rel(out, ref) < 0.1
    out.float().square().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == torch.bfloat16 and t.grad.shape == t.shape for t in (q, k, v))
    with torch.no_grad():  # inference: the same numbers, nothing saved for backward
        torch.testing.assert_close(sdpa(q, k, v, is_causal=True, enable_gqa=True), out.detach(), rtol=0, atol=0)
    three = sdpa(q[0].detach(), k[0].detach(), v[0].detach(), is_causal=True, enable_gqa=True)
    torch.testing.assert_close(three, out[0].detach(), rtol=0, atol=0)


def test_window_is_huggingface_sliding_window():
    """window=W with is_causal: the W most recent keys, the query's own included."""
    q, k, v = _qkv(s=40)
    W = 9
    i, j = torch.arange(40)[:, None], torch.arange(40)[None, :]
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=(j <= i) & (j > i - W))
    assert rel(sdpa(q, k, v, is_causal=True, window=W), ref) < 0.1
    torch.testing.assert_close(visible(40, 40, True, (W - 1, W - 1)), (j <= i) & (j > i - W))


@pytest.mark.parametrize("bad,error", [
    (lambda q, k, v: sdpa(q, k.double(), v), TypeError),
    (lambda q, k, v: sdpa(q, k[..., :16], v), ValueError),
    (lambda q, k, v: sdpa(q, k[:, :, :20], v), ValueError),
    (lambda q, k, v: sdpa(q, k[:, :1], v[:, :1]), ValueError),  # GQA without enable_gqa
    (lambda q, k, v: sdpa(q[:, :1], k, v, enable_gqa=True), ValueError),  # 1 query head, 2 key heads
    (lambda q, k, v: sdpa(q, k, v, window=0), ValueError),
    (lambda q, k, v: sdpa(q, k, v, window=(3, -1)), ValueError),
    (lambda q, k, v: sdpa(q, k, v, recipe="fp8"), TypeError),
    (lambda q, k, v: AttentionRecipe(block=48), ValueError),
    (lambda q, k, v: sdpa(q, k, v, backend="cuda"), ValueError),
    (lambda q, k, v: sdpa_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                                 torch.tensor([0.0, 24.0])), ValueError),
    (lambda q, k, v: sdpa_varlen(q[0, :, :, :24].transpose(0, 1), k[0, :, :, :24].transpose(0, 1),
                                 v[0, :, :, :24].transpose(0, 1), torch.tensor([0, 24])), ValueError),
], ids=["dtype", "head-dim", "kv-length", "gqa-flag", "heads", "window-0", "window-neg", "recipe", "block",
        "backend", "cu-float", "varlen-head-dim"])
def test_bad_input_raises(bad, error):
    with pytest.raises(error):
        bad(*_qkv())


@pytest.mark.parametrize("case", ["mask", "dropout", "head-dim-40", "float64"])
def test_falls_back_to_torch_with_one_warning(case):
    q, k, v = _qkv(d=40 if case == "head-dim-40" else 32, dtype=torch.float64 if case == "float64" else torch.float32)
    kw = {"mask": dict(attn_mask=torch.rand(24, 24) > 0.3), "dropout": dict(dropout_p=0.5)}.get(case, {})
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        torch.manual_seed(1)
        out = sdpa(q, k, v, **kw)
    messages = [str(x.message) for x in w]
    assert len(w) == 1 and "using torch's scaled_dot_product_attention" in messages[0], messages
    torch.manual_seed(1)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, **kw), rtol=0, atol=0)


def test_varlen_matches_one_call_per_sequence():
    lens = [5, 19, 12]
    T = sum(lens)
    q, k, v = outlier_inputs([(T, 4, 32), (T, 2, 32), (T, 2, 32)])
    cu = torch.tensor([0, 5, 24, 36], dtype=torch.int32)
    out = sdpa_varlen(q, k, v, cu, is_causal=True)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        one = sdpa(*(t[a:b].transpose(0, 1)[None] for t in (q, k, v)), is_causal=True, enable_gqa=True)
        torch.testing.assert_close(out[a:b], one[0].transpose(0, 1), rtol=0, atol=0)
    assert math.isfinite(out.sum().item())

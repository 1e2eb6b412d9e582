"""The Triton kernels (interpreted, on CPU tensors) against the exact emulation, forward and
backward, on tiny shapes that cross the interpreter's 32-wide tiles: ragged ends, causal and
windowed masks, cross attention, GQA, packed sequences, non-power-of-two head dims (192/128 and
48/32), the Hadamard option, per-head scales, Q quantized by the pass or inside the forward,
fp32 and bf16 inputs. The emulation computes the
kernels' numbers up to fp32 summation order, so the two agree far inside the FP8 error; both stay
within 1.25x of the plain per-head E4M3 baseline's error against float64
(``lowbit.validate.attention_baseline``). NaN inputs give NaN outputs."""
import pytest
import torch

from lowbit.kernels.attention import attention_backward, attention_forward
from lowbit.kernels.triton.runtime import interpreting
from lowbit.scaling import AttentionRecipe
from lowbit.validate.attention_baseline import exact, outlier_inputs, plain_e4m3, rel

AGREE = 2e-3  # kernel vs emulation, relative L2 (their FP8 error against float64 is ~5e-2)


def _both(q, k, v, dout, **kw):
    res = {}
    for backend in ("triton", "torch"):
        out, lse, _ = attention_forward(q, k, v, backend=backend, **kw)
        res[backend] = (out, *attention_backward(dout, q, k, v, out, lse, backend=backend, **kw))
    return res["triton"], res["torch"]


CASES = {  # (B, Hq, Hkv, Sq, Sk, D, Dv), kwargs, input dtype
    "causal-gqa-bf16": ((2, 2, 1, 35, 35, 32, 32), dict(causal=True), torch.bfloat16),
    # block=32 is the interpreter's tile: the forward quantizes Q itself (FUSE_Q); "bshd": the
    # tensors are (B, H, S, D) views of (B, S, H, D) memory, as Hugging Face passes them
    "d64-causal-fused-q-bshd": ((1, 2, 1, 70, 70, 64, 64), dict(causal=True, recipe=AttentionRecipe(block=32)),
                                torch.float32),
    # block=64: two interpreter tiles a scale block, the forward's amax reads the partner tile
    "cross-window-hadamard-fused-q-pair": ((1, 2, 2, 50, 20, 32, 32),
                                           dict(window=(8, 3), recipe=AttentionRecipe(hadamard=True, block=64)),
                                           torch.bfloat16),
    "d192-dv128-causal-window": ((1, 1, 1, 40, 40, 192, 128), dict(causal=True, window=(16, None)), torch.float32),
    "d48-dv32-per-head-scales": ((1, 2, 1, 33, 33, 48, 32), dict(recipe=AttentionRecipe(block=0)), torch.float32),
}


@pytest.mark.parametrize("name", list(CASES))
def test_kernels_match_the_emulation(name):
    assert interpreting(), "run with TRITON_INTERPRET=1 (tests/attention/conftest.py sets it)"
    (B, hq, hkv, sq, sk, d, dv), kw, dtype = CASES[name]
    q, k, v, dout = outlier_inputs([(B, hq, sq, d), (B, hkv, sk, d), (B, hkv, sk, dv), (B, hq, sq, dv)], dtype=dtype)
    if name.endswith("bshd"):
        q, k, v, dout = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, dout))
    kw = dict(dict(scale=d ** -0.5, recipe=AttentionRecipe()), **kw)
    kernel, emulated = _both(q, k, v, dout, **kw)
    mask = (kw.get("causal", False), kw.get("window", (None, None)), kw["scale"])
    ref = exact(q, k, v, dout, *mask)
    base = plain_e4m3(q, k, v, dout, *mask)
    for what, a, b, r, p in zip(("out", "dq", "dk", "dv"), kernel, emulated, ref, base):
        assert a.dtype == dtype and a.shape == r.shape
        assert rel(a, b) < AGREE, f"{what}: kernel vs emulation {rel(a, b):.3g}"
        assert rel(a, r) <= 1.25 * rel(p, r), f"{what}: {rel(a, r):.3g} against the plain E4M3 {rel(p, r):.3g}"


def test_packed_sequences():
    """cu_seqlens: each sequence attends to itself only; the kernels match the emulation and the
    emulation matches one dense call per sequence (the same numbers)."""
    lens = [7, 33, 20]
    T, hq, hkv, d = sum(lens), 2, 1, 32
    q, k, v, dout = outlier_inputs([(T, hq, d), (T, hkv, d), (T, hkv, d), (T, hq, d)])
    cu = torch.tensor([0, 7, 40, 60], dtype=torch.int32)
    kw = dict(causal=True, window=(12, None), scale=d ** -0.5, recipe=AttentionRecipe(), cu_seqlens=cu,
              max_seqlen=max(lens))
    kernel, emulated = _both(q, k, v, dout, **kw)
    for what, a, b in zip(("out", "dq", "dk", "dv"), kernel, emulated):
        assert rel(a, b) < AGREE, f"{what}: kernel vs emulation {rel(a, b):.3g}"
    dense = dict(kw, cu_seqlens=None, max_seqlen=None)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        seq = [t[a:b].transpose(0, 1)[None] for t in (q, k, v, dout)]
        out, lse, _ = attention_forward(*seq[:3], backend="torch", **dense)
        grads = attention_backward(seq[3], *seq[:3], out, lse, backend="torch", **dense)
        for got, want in zip(emulated, (out, *grads)):
            torch.testing.assert_close(got[a:b].transpose(0, 1)[None], want, rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy, on the NaN itself
def test_nan_in_nan_out():
    """A NaN in K makes the scores of its block NaN: the outputs that read it are NaN, not clipped."""
    q, k, v = outlier_inputs([(1, 1, 40, 32)] * 3)
    k[0, 0, 35, 3] = float("nan")
    out, _, _ = attention_forward(q, k, v, causal=True, scale=32 ** -0.5, recipe=AttentionRecipe(block=32),
                                  backend="triton")
    assert torch.isnan(out[0, 0, 32:]).all()  # rows that see key 35's scale block
    assert torch.isfinite(out[0, 0, :32]).all()  # causal rows before it never read it

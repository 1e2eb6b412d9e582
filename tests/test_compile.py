"""torch.compile(fullgraph=True) of from_float -> mm -> dequantize on the CPU.

fullgraph=True fails on any graph break, so these also show that quantization, the Delayed state
update and the emulated GEMM never read a value on the host. The compiled results must equal eager
bit for bit (inductor may not reassociate the quantization math), over several steps with
changing magnitudes (the Delayed scale changes, nothing recompiles into a wrong answer).
Compiles are slow (~30 s for inductor), so there are two: inductor on the FP8 training path
(rowwise activations, delayed-scaled weights, HYBRID E5M2 gradients) and one trace of every other
recipe with the ``aot_eager`` backend.
"""
import torch

from lowbit.dtypes import FP4Tensor, FP8Tensor
from lowbit.scaling import MX, NV, Blockwise, Current, Delayed, DelayedScalingState, Rowwise

DELAYED = Delayed(history_len=4)


def fp8_step(x, w, gy, st):
    a = FP8Tensor.from_float(x, Rowwise(), "input")
    b = FP8Tensor.from_float(w, DELAYED, "weight", state=st)
    g = FP8Tensor.from_float(gy, Current(), "grad")
    y = a @ b.t()
    dx = g @ b  # e5m2 x e4m3
    return y, dx, a.dequantize(), b.dequantize()


def test_inductor_fullgraph_fp8_delayed():
    gen = torch.Generator().manual_seed(0)
    x, w, gy = torch.randn(8, 64, generator=gen), torch.randn(16, 64, generator=gen), torch.randn(8, 16, generator=gen)
    st_c, st_e = DelayedScalingState(DELAYED, "e4m3"), DelayedScalingState(DELAYED, "e4m3")
    compiled = torch.compile(fp8_step, fullgraph=True)
    for step, m in enumerate((1.0, 30.0, 0.01)):
        got = compiled(x * m, w * m, gy * m, st_c)
        want = fp8_step(x * m, w * m, gy * m, st_e)
        for i, (g, e) in enumerate(zip(got, want)):
            assert g.dtype == e.dtype and torch.equal(g, e), (step, i)
        assert torch.equal(st_c.amax_history, st_e.amax_history) and torch.equal(st_c.scale, st_e.scale)
    assert st_c.scale.item() != 1.0


RECIPES = [(FP8Tensor, Current()), (FP8Tensor, Blockwise(act=(1, 32), weight=(32, 32))),
           (FP8Tensor, MX()), (FP4Tensor, MX(elem="e2m1", scale_rule="rceil")), (FP4Tensor, NV())]


def every_recipe(x, w):
    outs = []
    for cls, recipe in RECIPES:
        a, b = cls.from_float(x, recipe, "input"), cls.from_float(w, recipe, "weight")
        outs += [a @ b.t(), a.dequantize(), b.t().dequantize()]
    return outs


def test_fullgraph_trace_of_every_recipe():
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(8, 64, generator=gen), torch.randn(16, 64, generator=gen)
    x[0, 3] = float("nan")  # NaN handling traces too (no data-dependent branch)
    compiled = torch.compile(every_recipe, fullgraph=True, backend="aot_eager")
    got, want = compiled(x, w), every_recipe(x, w)
    for i, (g, e) in enumerate(zip(got, want)):
        assert torch.equal(g.isnan(), e.isnan()), i
        assert torch.equal(torch.nan_to_num(g), torch.nan_to_num(e)), i

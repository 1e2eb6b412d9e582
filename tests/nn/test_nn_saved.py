"""What a compiled converted model keeps for its backward: the FP8 (or FP4) x^T of each Linear, or,
under a tensorwise input scale, no more than the plain model keeps (x^T is cast again in the
backward from x, which the partitioner recomputes), and no low-precision copy of any weight (w^T is
cast again in the backward); the recasts give the bits of the forward's casts: compiled and eager
agree bit for bit on the Triton kernels too (where the backward's x is the forward's: a fused
recompute of x may skip a bf16 rounding, ``lowbit.nn.ops``). Within a backward, the dgrad's FP8
operands are freed before the wgrad runs."""
import pytest
import torch
from torch import nn

import lowbit
from benchmarks.saved_activations import saved_backend
from lowbit.convert import FORMATS

TOKENS, DIMS = 48, (32, 64, 32)  # every dim a multiple of 32: MX converts both Linears


def _model(fmt, backend="auto"):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(DIMS[0], DIMS[1]), nn.GELU(), nn.Linear(DIMS[1], DIMS[2]))
    return lowbit.convert(m, recipe=FORMATS[fmt](), filter=lambda n, mod: True, backend=backend)


def _saved(model) -> list:
    """(dtype, shape) of every value the backward graph takes but parameters and gradients."""
    saved = []
    torch._dynamo.reset()
    f = torch.compile(model, backend=saved_backend(saved), fullgraph=True)
    f(torch.randn(TOKENS, DIMS[0], requires_grad=True)).square().mean().backward()
    return [(dtype, shape) for dtype, shape, _ in saved]


@pytest.mark.parametrize("fmt", ["fp8-block", "mxfp8"])
def test_compiled_graph_keeps_x_transposed_in_fp8_and_no_weight_copy(fmt):
    fp8 = sorted(shape for dtype, shape in _saved(_model(fmt)) if dtype == torch.float8_e4m3fn)
    assert fp8 == sorted([(DIMS[0], TOKENS), (DIMS[1], TOKENS)])  # x^T of both Linears, nothing else


def test_compiled_tensorwise_graph_keeps_less_than_the_plain_model():
    """The plain model keeps GELU's input and output (Linear 2's input); the tensorwise FP8 graph
    keeps GELU's input only (Linear 2's x is recomputed from it and cast again) and the FP8 x^T of
    the graph's input (cheaper to keep than the fp32 input it would be cast again from)."""
    def big(saved):
        return sorted((str(dtype), shape) for dtype, shape in saved if len(shape) > 0)
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(DIMS[0], DIMS[1]), nn.GELU(), nn.Linear(DIMS[1], DIMS[2]))
    assert big(_saved(plain)) == [("torch.float32", (TOKENS, DIMS[1]))] * 2
    assert big(_saved(_model("fp8"))) == [("torch.float32", (TOKENS, DIMS[1])),
                                          ("torch.float8_e4m3fn", (DIMS[0], TOKENS))]


def test_a_plain_sibling_keeps_x_and_the_fp8_layer_casts_from_that_x():
    """q (converted, tensorwise) and k (kept in high precision, as the size rule keeps a small
    k_proj) read one 3-D input: k's backward keeps that x, and q casts its x^T again from it
    instead of keeping an FP8 copy as well (the (M, K) view is F.linear's own view node)."""
    class Siblings(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k = nn.Linear(DIMS[0], DIMS[1]), nn.Linear(DIMS[0], DIMS[1])

        def forward(self, x):
            h = torch.nn.functional.gelu(x)  # not a graph input: what the partitioner may recompute
            return self.q(h) + self.k(h)

    torch.manual_seed(0)
    m = lowbit.convert(Siblings(), recipe=FORMATS["fp8"](), filter=lambda n, mod: n == "q")
    saved: list = []
    torch._dynamo.reset()
    f = torch.compile(m, backend=saved_backend(saved), fullgraph=True)
    f(torch.randn(2, TOKENS // 2, DIMS[0], requires_grad=True)).square().mean().backward()
    big = sorted((str(dtype), shape) for dtype, shape, _ in saved if len(shape) > 1)
    assert big == [("torch.float32", (TOKENS, DIMS[0]))]  # k's x, and no FP8 x^T of q


@pytest.mark.parametrize("role", ["input", "grad"])  # HYBRID: E4M3 and E5M2
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_fusible_recast_is_the_kernels_cast_transposed(role, dtype):
    """``cast_t_fusible`` eager and under inductor = ``quantize_fp8_t``'s x^T bit for bit, on both
    backends, saturating values, infinities, signed zeros, NaN (its sign no part of the contract) and
    a 10-decade dynamic range."""
    from lowbit.kernels.api import quantize_fp8_t
    from lowbit.nn.ops import cast_t_fusible
    from lowbit.scaling import Current

    recipe = Current()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 96, generator=g) * torch.logspace(-6, 4, 96)
    x[0, :6] = torch.tensor([float("inf"), -float("inf"), -0.0, 0.0, 1e30, float("nan")])
    x = x.to(dtype)
    fmt = recipe.format(role)
    torch._dynamo.reset()
    compiled = torch.compile(cast_t_fusible, fullgraph=True)
    for backend in ("torch", "triton"):
        q, q_t = quantize_fp8_t(x, recipe, role, None, backend)
        want = q_t._data.view(torch.uint8)
        nan = q_t._data.float().isnan()
        assert nan.sum() == 1
        for got in (cast_t_fusible(x, q._scale, fmt), compiled(x, q._scale, fmt)):
            assert got.is_contiguous() and torch.equal(got.float().isnan(), nan)
            assert torch.equal(got.view(torch.uint8)[~nan], want[~nan])


@pytest.mark.parametrize("fmt,block,scales", [("nvfp4", 16, torch.float8_e4m3fn), ("mxfp4", 32, torch.uint8)])
def test_compiled_graph_keeps_x_transposed_in_fp4_and_no_weight_copy(fmt, block, scales):
    """x^T's codes (two a byte, the tokens padded to the block) and block scales (E8M0 as bits for
    MX) of both Linears, and nothing of the weights."""
    saved = _saved(_model(fmt))
    m_pad = -(-TOKENS // block) * block
    codes = [(k, m_pad // 2) for k in DIMS[:2]]
    block_scales = [(k, m_pad // block) for k in DIMS[:2]]
    by = {dt: sorted(shape for dtype, shape in saved if dtype == dt) for dt in (torch.uint8, torch.float8_e4m3fn)}
    if scales == torch.uint8:
        assert by[torch.uint8] == sorted(codes + block_scales) and by[torch.float8_e4m3fn] == []
    else:
        assert by[torch.uint8] == sorted(codes) and by[torch.float8_e4m3fn] == sorted(block_scales)


@pytest.mark.parametrize("fmt", ["fp8", "fp8-block"])
def test_compiled_and_eager_agree_bit_for_bit_on_the_triton_kernels(fmt):
    runs = []
    for compiled in (False, True):
        torch._dynamo.reset()
        m = _model(fmt, backend="triton")
        assert m[0].backend == m[2].backend == "triton"  # named, it serves the CPU under the interpreter
        f = torch.compile(m, backend="aot_eager", fullgraph=True) if compiled else m
        g = torch.Generator().manual_seed(1)
        out = []
        for _ in range(3):  # delayed scaling: the recast of step s uses step s's scale, not the updated one
            x = torch.randn(TOKENS, DIMS[0], generator=g).requires_grad_()
            y = f(x)
            y.square().mean().backward()
            out += [y.detach(), x.grad, m[0].weight.grad, m[2].weight.grad]
            m.zero_grad()
        runs.append(out + [b.clone() for _, b in sorted(m.state_dict().items())])
    assert len(runs[0]) == len(runs[1]) and all(torch.equal(a, b) for a, b in zip(*runs))


@pytest.mark.parametrize("compiled", [False, True])
def test_the_dgrad_operands_are_freed_before_the_wgrad(compiled, monkeypatch):
    """In each Linear's backward the wgrad GEMM runs after the cast gradient of the dgrad is gone,
    and, in the compiled graph (which casts w^T again), after that w^T is gone too."""
    import weakref

    from torch._subclasses.fake_tensor import FakeTensor

    from lowbit.nn import ops

    made, at_wgrad = {}, []  # the latest grad cast and w^T recast; their liveness at each wgrad GEMM
    real_cast, real_recast, real_mm = ops.quantize_fp8_t, ops._recast_t, ops.scaled_mm

    def cast(x, recipe, role, *args):
        q, q_t = real_cast(x, recipe, role, *args)
        if role == "grad" and not isinstance(q._data, FakeTensor):
            made.update(qg=weakref.ref(q._data), wt=None)
        return q, q_t

    def recast(*args):
        wt = real_recast(*args)
        if not isinstance(wt._data, FakeTensor):
            made["wt"] = weakref.ref(wt._data)
        return wt

    def mm(a, b, *args, **kwargs):
        qg = made.get("qg")
        if qg is not None and not isinstance(a._data, FakeTensor) and qg() is not a._data:  # a backward's wgrad
            wt = made["wt"]
            at_wgrad.append((qg() is None, wt is None or wt() is None, wt is not None))
        return real_mm(a, b, *args, **kwargs)
    monkeypatch.setattr(ops, "quantize_fp8_t", cast)
    monkeypatch.setattr(ops, "_recast_t", recast)
    monkeypatch.setattr(ops, "scaled_mm", mm)
    torch._dynamo.reset()
    m = _model("fp8")
    f = torch.compile(m, backend="aot_eager", fullgraph=True) if compiled else m
    f(torch.randn(TOKENS, DIMS[0], requires_grad=True)).square().mean().backward()
    assert at_wgrad == [(True, True, compiled)] * 2  # both Linears; a recast only in the compiled graph

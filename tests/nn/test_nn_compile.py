"""torch.compile(fullgraph=True) of converted models: no graph break (fullgraph raises on one), the
delayed-scaling buffers are updated in place in the forward and the backward, and the run
matches eager mode."""
import torch
import torch._dynamo
from torch import nn

import lowbit
from lowbit.scaling import NV, Delayed


def _model(recipe):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16))
    return lowbit.convert(m, recipe=recipe, filter=lambda n, mod: True)


def _train(m, compile_backend=None, steps=4):
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    f = torch.compile(m, fullgraph=True, backend=compile_backend) if compile_backend else m
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 32, generator=g)
        loss = f(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, m.state_dict()


def test_delayed_scaling_compiles_fullgraph_with_inductor_and_matches_eager():
    torch._dynamo.reset()
    eager_losses, eager_sd = _train(_model(Delayed(history_len=4)))
    comp_losses, comp_sd = _train(_model(Delayed(history_len=4)), "inductor")
    # inductor may reorder the fp32 ops around the lowbit ops (GELU, bias grad sums)
    torch.testing.assert_close(comp_losses, eager_losses, rtol=1e-5, atol=0)
    for k, v in eager_sd.items():
        torch.testing.assert_close(comp_sd[k], v, rtol=1e-5, atol=1e-7, msg=k)
    # the grad history was filled by the compiled backward: 4 steps -> 4 nonzero entries
    assert (comp_sd["0.lowbit_state.grad.amax_history"] > 0).sum() == 4
    assert comp_sd["0.lowbit_state.input.scale"] != 1.0


def test_nvfp4_stochastic_rounding_compiles_and_replays_eager_bit_for_bit():
    torch._dynamo.reset()
    eager_losses, eager_sd = _train(_model(NV()), steps=3)
    comp_losses, comp_sd = _train(_model(NV()), "aot_eager", steps=3)
    assert comp_losses == eager_losses
    assert torch.equal(comp_sd["0.weight"], eager_sd["0.weight"])
    assert comp_sd["0.lowbit_state.sr._extra_state"] == {"step": 3}


def test_fp8_and_nvfp4_compile_for_changing_token_counts_and_match_eager_bit_for_bit():
    """The second token count makes Dynamo trace the tokens as a symbolic size: the ops' fake
    implementations then run on symbolic shapes (NV's stochastic rounding among them)."""
    from lowbit.convert import FORMATS
    for fmt in ("fp8", "nvfp4"):
        torch._dynamo.reset()
        runs = []
        for compiled in (False, True):
            m = _model(FORMATS[fmt]())
            f = torch.compile(m, fullgraph=True, backend="aot_eager") if compiled else m
            g = torch.Generator().manual_seed(1)
            out = []
            for tokens in (16, 48, 80):
                x = torch.randn(tokens, 32, generator=g).requires_grad_()
                y = f(x)
                y.square().mean().backward()
                out += [y.detach(), x.grad, m[0].weight.grad]
                m.zero_grad()
            runs.append(out)
        assert all(torch.equal(a, b) for a, b in zip(*runs)), fmt


def test_compiled_graphs_call_the_custom_ops_and_eager_bypasses_them():
    """Under torch.compile the forward and backward graphs hold the lowbit custom ops (not the
    emulation traced through); eager mode runs their Python implementations without the custom-op
    dispatch (FP8: the ops' bodies ``fp8_forward`` / ``fp8_backward`` on the layer's own recipe and
    state; FP4: ``ops.EAGER``), with the same results."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from lowbit.nn import ops
    torch._dynamo.reset()
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(str(gm.graph))
        return make_boxed_func(gm.forward)
    for recipe, kind in ((Delayed(history_len=4), "fp8"), (NV(), "fp4")):
        graphs.clear()
        m = _model(recipe)
        f = torch.compile(m, fullgraph=True, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))
        f(torch.randn(16, 32)).sum().backward()
        fw, bw = graphs
        assert fw.count(f"lowbit.{kind}_linear_fwd") == 2 and bw.count(f"lowbit.{kind}_linear_bwd") == 2
        assert "aten.round" not in fw + bw  # no emulated quantization traced into the graphs
    calls = []
    real = dict(ops.EAGER)
    fwd, bwd = ops.fp8_forward, ops.fp8_backward
    try:
        for name, fn in real.items():
            ops.EAGER[name] = lambda *a, fn=fn, name=name: calls.append(name) or fn(*a)
        ops.fp8_forward = lambda *a: calls.append("fp8_forward") or fwd(*a)
        ops.fp8_backward = lambda *a: calls.append("fp8_backward") or bwd(*a)
        m = _model(Delayed(history_len=4))
        m(torch.randn(16, 32)).sum().backward()
        m = _model(NV())
        m(torch.randn(16, 32)).sum().backward()
    finally:
        ops.EAGER.update(real)
        ops.fp8_forward, ops.fp8_backward = fwd, bwd
    # eager FP8: the ops' bodies on the layer's own state (no custom op, no op-level wrapper); FP4: EAGER
    assert calls.count("fp8_forward") == 2 and calls.count("fp8_backward") == 2
    assert "fp8_linear_fwd" not in calls and calls.count("fp4_linear_fwd") == 2 and calls.count("fp4_linear_bwd") == 2


def test_delayed_graphs_take_only_module_buffers_and_recompile_once_when_primed():
    """CUDA-graph preconditions (``mode="reduce-overhead"`` skips a graph with a CPU tensor input):
    every tensor the ops take from a layer's state is a buffer of it (so it moves with the model),
    the cold start is a Python flag set by the first step, and torch.compile recompiles once for
    it, after which steps hit the cached graph."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    m = _model(Delayed(history_len=4))
    for layer in (m[0], m[2]):
        st = layer.lowbit_state
        assert {id(t) for t in st.tensors()} <= {id(b) for b in st.buffers()}
        assert st.cold_start() == (True, True, True)
    counters.clear()
    f = torch.compile(m, fullgraph=True, backend="aot_eager")
    for step in range(3):
        f(torch.randn(16, 32)).sum().backward()
        assert all(layer.lowbit_state.cold_start() == (False, False, False) for layer in (m[0], m[2]))
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    # a forward that autograd does not record leaves the grad's cold start to a later step
    fresh = _model(Delayed(history_len=4))
    with torch.no_grad():
        fresh(torch.randn(16, 32))
    assert fresh[0].lowbit_state.cold_start() == (False, False, True)


def test_mx_recipes_compile_with_inductor_and_match_eager_bit_for_bit():
    """MX scales are E8M0, on which inductor declines every pattern: a mutating custom op that
    returned or took them stayed an ``auto_functionalized_v2`` node and compilation stopped in the
    post-grad passes. The ops carry them as uint8 bits. One Linear without bias, x and W both
    needing gradients (so the forward returns, and the backward takes, the E8M0 scales of both
    saved operands): nothing outside the lowbit ops does arithmetic, so the compiled forward and
    backward equal eager bit for bit."""
    import copy
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(32, 64, generator=g)
    gy = torch.randn(32, 32, generator=g)
    for fmt in ("mxfp8", "mxfp4"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        m = lowbit.convert(nn.Sequential(nn.Linear(64, 32, bias=False)), fmt, filter=lambda n, mod: True)
        c = copy.deepcopy(m)
        out = {}
        for name, mod in (("eager", m), ("compiled", c)):
            f = torch.compile(mod, fullgraph=True, backend="inductor") if name == "compiled" else mod
            x = x0.clone().requires_grad_(True)
            y = f(x)
            y.backward(gy)
            out[name] = (y.detach(), x.grad, mod[0].weight.grad)
        assert all(torch.equal(a, b) for a, b in zip(out["eager"], out["compiled"])), fmt
        assert all(t.abs().sum() > 0 for t in out["compiled"]), fmt


def test_graphs_of_every_format_take_only_parameters_buffers_and_inputs():
    """CUDA-graph preconditions of ``mode="reduce-overhead"`` that the CPU can check: every tensor
    a compiled graph takes is a parameter or buffer of the model (they move with it to the GPU, and
    inductor treats them as static) or the user's input; a tensor held any other way stays on the
    CPU, and inductor skips the CUDA graph of a graph with a CPU tensor. After the first step no
    format recompiles (Delayed compiles twice in step one's wake: cold start, then primed). NV's
    stochastic rounding included: its key (seed, step) is a buffer, read and advanced on the device."""
    from lowbit.convert import FORMATS
    graphs = []

    def record(gm, example_inputs):
        graphs.append(example_inputs)
        return gm.forward
    for fmt in FORMATS:
        torch._dynamo.reset()
        graphs.clear()
        m = lowbit.convert(nn.Sequential(nn.Linear(32, 32)), fmt, filter=lambda n, mod: True)
        f = torch.compile(m, fullgraph=True, backend=record)
        xs = [torch.randn(16, 32, requires_grad=True) for _ in range(3)]
        for x in xs:
            f(x).sum().backward()
        owned = {id(t) for t in list(m.parameters()) + list(m.buffers()) + xs}
        foreign = [t for ex in graphs for t in ex if isinstance(t, torch.Tensor) and id(t) not in owned]
        assert not foreign, (fmt, [tuple(t.shape) for t in foreign])  # (nvfp4's SR key is a buffer)
        assert len(graphs) == (2 if fmt == "fp8" else 1), (fmt, len(graphs))

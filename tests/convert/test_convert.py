"""lowbit.convert / unconvert: every format name, what is skipped and why (one warning), filters,
idempotence, meta-device models, non-float parameters, and the backend fallback."""
import warnings
from dataclasses import replace

import pytest
import torch
from torch import nn

import lowbit
from lowbit.convert import FORMATS, HEAD_NAMES, recipe_for
from lowbit.kernels import BACKENDS
from lowbit.nn import Linear, LowbitModule
from lowbit.scaling import MX, NV, Blockwise, Current, Delayed, Rowwise


class Net(nn.Module):
    def __init__(self, d=64, classes=10):
        super().__init__()
        self.up = nn.Linear(d, 2 * d)
        self.odd = nn.Linear(2 * d, 40)  # 40: not a multiple of 16 (nor 32)
        self.down = nn.Linear(40, d)
        self.mid = nn.Linear(d, 48)  # 48: multiple of 16, not of 32
        self.back = nn.Linear(48, d)
        self.lm_head = nn.Linear(d, 64)

    def forward(self, x):
        h = torch.relu(self.up(x))
        h = self.down(torch.relu(self.odd(h)))
        h = self.back(torch.relu(self.mid(h)))
        return self.lm_head(h)


def _convert(model, *args, **kw):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = lowbit.convert(model, *args, **kw)
    return out, [str(w.message) for w in rec if "lowbit" in str(w.message)]


def _converted(model):
    return sorted(n for n, m in model.named_modules() if isinstance(m, LowbitModule))


def test_format_names_map_to_recipes():
    assert recipe_for("fp8") == Delayed() and recipe_for("fp8-current") == Current()
    assert recipe_for("fp8-rowwise") == Rowwise() and recipe_for("fp8-block") == Blockwise()
    assert recipe_for("mxfp8") == MX(elem="e4m3", scale_rule="rceil")
    assert recipe_for("mxfp4") == MX(elem="e2m1") and recipe_for("nvfp4") == NV()
    with pytest.raises(ValueError, match="unknown format 'fp7'"):
        lowbit.convert(Net(), "fp7")
    with pytest.raises(TypeError, match="lowbit recipe"):
        lowbit.convert(Net(), recipe="e4m3")


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_format_converts_trains_and_skips_with_one_warning(fmt):
    torch.manual_seed(0)
    m = Net()
    m, msgs = _convert(m, fmt)
    block32 = fmt in ("mxfp8", "mxfp4")
    want = ["up"] if block32 else ["back", "mid", "up"]
    assert _converted(m) == want
    assert len(msgs) == 1
    assert "odd: in_features=128, out_features=40" in msgs[0] and "down: in_features=40" in msgs[0]
    assert "lm_head: output head" in msgs[0]
    assert ("mid: in_features=64, out_features=48" in msgs[0]) == block32
    assert ("back: in_features=48, out_features=64" in msgs[0]) == block32
    x = torch.randn(2, 8, 64)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    y0 = torch.randn(2, 8, 64)
    losses = []
    for _ in range(3):
        loss = (m(x) - y0).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_default_filter_skips_heads_by_name_and_tied_weights_nothing_by_position():
    one, msgs = _convert(nn.Linear(64, 64), "fp8-current")
    assert isinstance(one, Linear) and msgs == []  # a bare Linear converts
    mlp, msgs = _convert(nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.Linear(32, 32)), "fp8")
    assert _converted(mlp) == ["0", "2", "3"] and msgs == []  # the last layer too
    for head in HEAD_NAMES:
        net = nn.Module()
        net.add_module("body", nn.Linear(32, 32))
        net.add_module(head, nn.Linear(32, 32))
        net.add_module("after", nn.Linear(32, 32))
        net, msgs = _convert(net, "fp8-current")
        assert _converted(net) == ["after", "body"] and f"{head}: output head" in msgs[0]
    tied = nn.Module()
    tied.emb, tied.proj, tied.out = nn.Embedding(32, 32), nn.Linear(32, 32), nn.Linear(32, 32, bias=False)
    tied.out.weight = tied.emb.weight
    tied, msgs = _convert(tied, "fp8")
    assert _converted(tied) == ["proj"] and "out: weight is shared with another module (tied)" in msgs[0]


def test_filter_and_torchao_module_filter_fn():
    def seq():
        return nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32))
    m, msgs = _convert(seq(), "fp8", filter=lambda n, mod: n != "0")
    assert _converted(m) == ["1", "2"] and "0: excluded by filter" in msgs[0]
    seen = []

    def fn(mod, fqn):  # torchao's argument order: (module, fully qualified name)
        seen.append((type(mod), fqn))
        return fqn != "1"
    m, msgs = _convert(seq(), "fp8", module_filter_fn=fn)
    assert _converted(m) == ["0", "2"] and "1: excluded by filter" in msgs[0]
    assert seen == [(nn.Linear, "0"), (nn.Linear, "1"), (nn.Linear, "2")]
    # a user filter replaces the head rule: it may convert a layer named lm_head
    net = nn.Module()
    net.lm_head = nn.Linear(32, 32)
    net, _ = _convert(net, "fp8", module_filter_fn=lambda mod, fqn: True)
    assert _converted(net) == ["lm_head"]
    with pytest.raises(TypeError, match="filter=.*module_filter_fn=.*not both"):
        lowbit.convert(seq(), "fp8", filter=lambda n, mod: True, module_filter_fn=lambda mod, n: True)


def test_no_linear_layers_warns_and_leaves_model_unchanged():
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    before = {k: v.clone() for k, v in m.state_dict().items()}
    out, msgs = _convert(m, "fp8")
    assert out is m and len(msgs) == 1 and "no Linear layers" in msgs[0]
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())


def test_nonfloat_tied_mha_and_subclass_layers_are_skipped_with_reasons():
    class Custom(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(32, 32)
            self.q = nn.Linear(32, 32)
            self.q.weight = nn.Parameter(torch.zeros(32, 32, dtype=torch.int8), requires_grad=False)
            self.tied = nn.Linear(32, 32, bias=False)
            self.tied.weight = self.emb.weight
            self.attn = nn.MultiheadAttention(32, 2)
            self.custom = Custom(32, 32)
            self.f64 = nn.Linear(32, 32).double()
            self.ok = nn.Linear(32, 32)

    m, msgs = _convert(M(), "fp8")
    assert _converted(m) == ["ok"]
    msg = msgs[0]
    for part in ("q: parameters are torch.int8, not floating point", "tied: weight is shared",
                 "attn.out_proj: nn.MultiheadAttention reads this weight", "custom: Custom overrides",
                 "f64: parameters are torch.float64"):
        assert part in msg, part


def test_idempotent_same_recipe_error_other_recipe_and_unconvert():
    m = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 16))
    params = [id(p) for p in m.parameters()]
    m, _ = _convert(m, "fp8")
    first = m[0]
    m, _ = _convert(m, "fp8")
    assert m[0] is first and _converted(m) == ["0", "1", "2"]
    with pytest.raises(ValueError, match="already converted"):
        lowbit.convert(m, "nvfp4")
    lowbit.unconvert(m)
    assert all(type(x) is nn.Linear for x in m) and [id(p) for p in m.parameters()] == params
    assert set(m.state_dict()) == {f"{i}.{p}" for i in range(3) for p in ("weight", "bias")}
    m, _ = _convert(m, "nvfp4")
    assert _converted(m) == ["0", "1", "2"]
    # a bare Linear is returned, not swapped in place
    one, _ = _convert(nn.Linear(32, 32), "fp8", filter=lambda n, mod: True)
    assert isinstance(one, Linear) and type(lowbit.unconvert(one)) is nn.Linear


def test_meta_device_model_converts_without_data_then_materializes():
    with torch.device("meta"):
        m = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32), nn.Linear(32, 16))
    m, _ = _convert(m, "fp8")
    assert _converted(m) == ["0", "2", "3"]
    assert m[0].weight.is_meta and m[0].lowbit_state.input.scale.is_meta
    y = m(torch.empty(3, 32, device="meta"))
    assert y.shape == (3, 16) and y.is_meta
    m.to_empty(device="cpu")
    for mod in m.modules():
        if isinstance(mod, nn.Linear):
            mod.reset_parameters()
        if isinstance(mod, LowbitModule):
            mod.reset_recipe_state()
    assert m[0].lowbit_state.input.scale.item() == 1.0 and m[0].lowbit_state.input.amax_history.abs().sum() == 0
    m(torch.randn(3, 32)).sum().backward()
    assert torch.isfinite(m[0].weight.grad).all()


def test_the_triton_backend_named_serves_the_cpu_under_the_interpreter_only(monkeypatch):
    for interpret, backend in (("1", "triton"), ("0", "auto")):
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
        m, msgs = _convert(nn.Sequential(nn.Linear(32, 32)), "fp8-current", backend="triton")
        assert m[0].backend == backend and any("cannot serve" in s for s in msgs) == (backend == "auto")


def test_backend_that_cannot_serve_the_device_falls_back_with_a_warning(monkeypatch):
    monkeypatch.setitem(BACKENDS.backends, "cuda-only",
                        replace(BACKENDS.get("torch"), name="cuda-only", devices=("cuda",)))
    m, msgs = _convert(nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 16)), "fp8-current", backend="cuda-only")
    assert m[0].backend == "auto" and any("cannot serve the device of 0" in s for s in msgs)
    with pytest.raises(ValueError, match="unknown backend"):
        lowbit.convert(nn.Linear(32, 32), "fp8", backend="nope")
    # no backend at all for the device: the layer stays in high precision, with the reason
    monkeypatch.setitem(BACKENDS.backends, "torch", replace(BACKENDS.get("torch"), devices=("cuda",)))
    monkeypatch.setitem(BACKENDS.backends, "cuda-only", replace(BACKENDS.get("torch"), devices=("cuda",)))
    m, msgs = _convert(nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 16)), "fp8-current")
    assert _converted(m) == [] and "0: no lowbit backend serves device 'cpu'" in msgs[0]

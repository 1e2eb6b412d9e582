"""The fused casts (lowbit.kernels.triton.cast_fp8, cast_fp4) on the Triton CPU interpreter.

Every kernel output is compared bit for bit (data, scales, delayed-scaling state, generator state)
with the torch reference (FP8Tensor/FP4Tensor.from_float, lowbit.kernels.api's reference paths),
on shapes with partial tiles and blocks, NaN / +-inf / -0 / subnormals / exact rounding ties; the
kernels' fast exact division against IEEE ``x / s`` for every bf16 x and scales over the whole
fp32 range; the sm_90 PTX (IEEE division, no contraction, the RNE float8 cast).
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import triton
import triton.language as tl

from lowbit.dtypes.fp4_tensor import FP4Tensor
from lowbit.dtypes.fp8_tensor import FP8Tensor
from lowbit.dtypes.formats import E4M3
from lowbit.kernels import api as cast
from lowbit.kernels.triton import TRITON_BACKEND, make_backend
from lowbit.kernels.triton import jit_common as quantize_jit_helpers
from lowbit.kernels.triton.cast_common import kernels_interpreted
from lowbit.kernels.triton.cast_fp4 import kernels as quantize_fp4_kernels
from lowbit.kernels.triton.cast_fp4 import pairs as quantize_fp4_pairs_kernels
from lowbit.kernels.triton.cast_fp8 import CAST_TUNING
from lowbit.kernels.triton.cast_fp8 import blocks as quantize_fp8_block_kernels
from lowbit.kernels.triton.cast_fp8 import cols_t as quantize_fp8_cols_t_kernels
from lowbit.kernels.triton.cast_fp8 import rowlocal as quantize_fp8_rowblock_kernels
from lowbit.kernels.triton.cast_fp8 import rowwise as quantize_fp8_rowwise_t_kernels
from lowbit.kernels.triton.cast_fp8 import tensorwise as quantize_fp8_tensor_row_kernels
from lowbit.kernels.triton.runtime import Launch, unwrap
from lowbit.scaling.blocks import Block, block_amax
from lowbit.scaling.delayed import DelayedScalingState
from lowbit.scaling.hadamard import hadamard16, random_signs
from lowbit.scaling.recipes import MX, NV, Blockwise, Current, Delayed, Rowwise
from sm90 import run_script

if not kernels_interpreted():
    raise RuntimeError("lowbit's Triton kernels are not interpreted: run pytest with TRITON_INTERPRET=1 set in the "
                       "environment (triton was imported before tests/kernels/conftest.py could set it)")

FP8_RECIPES = {"current": Current(), "rowwise": Rowwise(), "blockwise": Blockwise(), "mx": MX(),
               "mx-e5m2-rceil": MX(elem="e5m2", scale_rule="rceil")}
FP4_RECIPES = {"nv": NV(), "nv-1d": NV(weight_2d=False, sr_grads=False), "mx-e2m1": MX(elem="e2m1"),
               "mx-e2m1-rceil": MX(elem="e2m1", scale_rule="rceil")}
ROLES = ("input", "weight", "grad")


def specials(shape, dtype=torch.bfloat16, seed=0):
    """Normal values over several binades, with NaN, -NaN, +-inf, -0, a subnormal and a large value."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-6, 7, shape, generator=g).float())
    flat = x.view(-1)
    n = flat.numel()
    for i, v in enumerate((float("nan"), float("inf"), -float("inf"), -0.0, 1e-40, 3e4)):
        flat[(i * 7919) % n] = v
    flat[(11 * 7919) % n] = -float("nan")
    return x.to(dtype)


def _bits(t):
    t = t.contiguous()
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int32)


def assert_bits(got, ref, what):
    assert got.dtype == ref.dtype and got.shape == ref.shape, f"{what}: {got.dtype}{tuple(got.shape)} vs " \
        f"{ref.dtype}{tuple(ref.shape)}"
    diff = _bits(got) != _bits(ref)
    assert not bool(diff.any()), f"{what}: {int(diff.sum())} differ, e.g. {_bits(got)[diff][:4].tolist()} " \
        f"vs {_bits(ref)[diff][:4].tolist()}"


def assert_fp8(got, ref, what=""):
    assert isinstance(got, FP8Tensor), f"{what}: declined"
    assert_bits(got._data, ref._data, f"{what} data")
    assert_bits(got._scale, ref._scale, f"{what} scale")
    assert (got._block, got._orig_dtype) == (ref._block, ref._orig_dtype), what


def assert_fp4(got, ref, what=""):
    assert isinstance(got, FP4Tensor), f"{what}: declined"
    for name in ("_qdata", "_scale", "_global_scale"):
        assert_bits(getattr(got, name), getattr(ref, name), f"{what} {name}")
    assert (got._block, got._kind, got._transposed, got._orig_dtype) == \
        (ref._block, ref._kind, ref._transposed, ref._orig_dtype), what


def backend(**tuning):
    """The Triton backend, or one built with these CastTuning fields overridden."""
    return make_backend(cast_tuning=CAST_TUNING.override(**tuning)) if tuning else TRITON_BACKEND


def launched(monkeypatch) -> list:
    """Records (kernel name, grid, constexprs and options) of every launch from now on."""
    seen, call = [], Launch.__call__

    def spy(self, *args):
        seen.append((unwrap(self.kernel).fn.__name__, self.grid, self.consts))
        return call(self, *args)
    monkeypatch.setattr(Launch, "__call__", spy)
    return seen


def check_fp8(x, recipe, role, transposed=False, be=TRITON_BACKEND):
    if transposed:
        q, qt = be.quantize_fp8_t(x, recipe, role, None)
        rq, rqt = cast.quantize_fp8_t(x, recipe, role, backend="torch")
        assert_fp8(q, rq, f"{recipe} {role} q")
        assert_fp8(qt, rqt, f"{recipe} {role} q_t")
        return q, qt
    got, ref = be.quantize_fp8(x, recipe, role, None), FP8Tensor.from_float(x, recipe, role)
    assert_fp8(got, ref, f"{recipe} {role}")
    if x.dim() <= 2:
        assert got._data.stride() == ref._data.stride()  # x's memory layout kept, as the reference
    return got


def check_fp4(x, recipe, role, signs=None, seed=0, be=TRITON_BACKEND):
    g_ref, g_got = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    ref = cast.quantize_fp4(x, recipe, role, g_ref, signs, backend="torch")
    got = be.quantize_fp4(x, recipe, role, g_got, signs)
    assert_fp4(got, ref, f"{recipe} {role} hadamard={signs is not None}")
    assert torch.equal(g_got.get_state(), g_ref.get_state()), "the kernel must consume the generator as the reference"
    return got


# ---- FP8 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FP8_RECIPES)
def test_fp8_cast_and_transpose_bit_exact(name):
    x = specials((37, 300))  # partial tiles and blocks along both dims
    for role in ROLES:
        check_fp8(x, FP8_RECIPES[name], role)
        check_fp8(x, FP8_RECIPES[name], role, transposed=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fp8_input_dtypes(dtype):
    x = specials((33, 160), dtype, seed=1)
    check_fp8(x, Current(), "grad", transposed=True)
    check_fp8(x, Blockwise(), "weight", transposed=True)
    check_fp8(x, MX(scale_rule="rceil"), "input")


@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_delayed_scaling_amax_fused(algo):
    recipe = Delayed(history_len=3, margin=1, amax_algo=algo)
    for role in ("input", "grad"):
        ref_state, state = (DelayedScalingState(recipe, recipe.format(role)) for _ in range(2))
        for step in range(4):
            x = specials((37, 300), seed=step) * (4.0 ** (step % 3 - 1))
            transposed = step == 3
            if transposed:
                q, qt = TRITON_BACKEND.quantize_fp8_t(x, recipe, role, state)
                rq, rqt = cast.quantize_fp8_t(x, recipe, role, ref_state, backend="torch")
                assert_fp8(qt, rqt, "q_t")
                assert qt._scale is q._scale  # one scale for both copies, as the reference
            else:
                q = TRITON_BACKEND.quantize_fp8(x, recipe, role, state)
                rq = FP8Tensor.from_float(x, recipe, role, state=ref_state)
            assert_fp8(q, rq, f"step {step}")
            assert_bits(state.amax_history, ref_state.amax_history, "amax history")
            assert_bits(state.scale, ref_state.scale, "state scale")
        assert float(state.amax_history.max()) > 0


def test_delayed_state_subclass_keeps_its_update():
    """The fused state update is DelayedScalingState.update's; a subclass's own update is called."""
    calls = []

    class Logged(DelayedScalingState):
        def update(self, amax):
            calls.append(float(amax))
            super().update(amax)

    recipe = Delayed(history_len=2)
    x = specials((16, 64), seed=16)
    state, ref_state = Logged(recipe, E4M3), DelayedScalingState(recipe, E4M3)
    for _ in range(2):
        assert_fp8(TRITON_BACKEND.quantize_fp8(x, recipe, "input", state),
                   FP8Tensor.from_float(x, recipe, "input", state=ref_state))
    assert len(calls) == 2 and calls[0] == float(block_amax(x, Block(-1, -1)))
    assert_bits(state.amax_history, ref_state.amax_history, "amax history")
    assert_bits(state.scale, ref_state.scale, "state scale")


def test_div_rn_path_bit_exact():
    """The per-element ``div.rn`` variant (``CastTuning.fast_div`` off) gives the same bits."""
    be = backend(fast_div=False)
    x = specials((37, 300), seed=17)
    for recipe, role in ((Current(), "grad"), (Rowwise(), "input"), (Blockwise(), "weight")):
        check_fp8(x, recipe, role, transposed=True, be=be)
    check_fp4(x[:, :288], NV(), "grad", random_signs(3), be=be)


def test_fp8_layouts():
    base = specials((300, 37), seed=2)
    for x in (base.t(), base[:200, :30], base[:, 0].contiguous(), specials((2, 5, 96), seed=3),
              specials((5, 2, 96), seed=4).transpose(0, 1)):
        for recipe in (Current(), Rowwise(), Blockwise(), MX()):
            check_fp8(x, recipe, "input")
    check_fp8(base.t(), Blockwise(), "weight", transposed=True)
    check_fp8(base.t(), Rowwise(), "input", transposed=True)


def test_fp8_many_tiles_grid_stride():
    x = specials((160, 1100), seed=5)  # several tiles per program in the grid-stride kernels
    recipe = Delayed(history_len=2)
    ref_state, state = DelayedScalingState(recipe, E4M3), DelayedScalingState(recipe, E4M3)
    for _ in range(2):
        assert_fp8(TRITON_BACKEND.quantize_fp8(x, recipe, "input", state),
                   FP8Tensor.from_float(x, recipe, "input", state=ref_state))
    assert_bits(state.amax_history, ref_state.amax_history, "amax history")
    check_fp8(x, Current(), "input")
    check_fp8(x, Rowwise(), "input")  # rows longer than one column chunk of the one-pass kernel
    check_fp8(specials((1100, 24), seed=15), Rowwise(), "grad", transposed=True)  # several row chunks
    check_fp8(x, Blockwise(), "input", transposed=True)


def _edge_tensors():
    # rounding ties: e4m3 / e5m2 midpoints (normal and subnormal) times 2^k, with a block amax that
    # makes the MX scale 2^k; values straddling E4M3/E5M2 max; fp32 subnormals; huge values
    mids = torch.tensor([1.0625, 1.1875, 9.5, 2.0 ** -10 * 3, 2.0 ** -10, 2.0 ** -8 * 5, 432.0, 440.0, 447.9,
                         300.0, -1.0625, -2.0 ** -10 * 3, 2.0 ** -17, 3 * 2.0 ** -17, 1.125 * 2.0 ** -14, 400.0])
    ties = torch.cat([mids * 2.0 ** k for k in (-20, 0, 9)]).reshape(3, 16).repeat(1, 4)
    return {"ties": ties, "zeros": torch.zeros(4, 64), "nonfinite": torch.tensor([[float("nan"), float("inf")] * 32]),
            "tiny": torch.full((2, 64), 1e-41) * torch.arange(128.0).reshape(2, 64),
            "huge": torch.full((2, 64), 3.0e38) / torch.arange(1.0, 129.0).reshape(2, 64)}


@pytest.mark.parametrize("case", list(_edge_tensors()))
def test_fp8_edge_values(case):
    x = _edge_tensors()[case]
    for recipe in (Current(), Current(input_format="e5m2"), Rowwise(), Blockwise(act=(1, 32)), MX(),
                   MX(elem="e5m2", scale_rule="rceil")):
        check_fp8(x, recipe, "input")


@triton.jit
def _div_probe_kernel(x_ptr, s_ptr, out_ptr, N, S: tl.constexpr, BLOCK: tl.constexpr, FAST_DIV: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=1.0)
    s = tl.load(s_ptr + tl.arange(0, S))
    p2k, sp, ys = quantize_jit_helpers._div_parts(s, FAST_DIV)
    q = quantize_jit_helpers._div_rn(x[None, :], p2k[:, None], sp[:, None], ys[:, None], FAST_DIV)
    tl.store(out_ptr + tl.arange(0, S)[:, None] * N + offs[None, :], q, mask=(offs < N)[None, :])


def _div_probe(x, s, fast):
    out = torch.empty(s.numel(), x.numel())
    _div_probe_kernel[(triton.cdiv(x.numel(), 8192),)](x, s, out, x.numel(), S=s.numel(), BLOCK=8192, FAST_DIV=fast)
    return out


@pytest.mark.parametrize("inputs", ["all bf16", "random fp32"])
def test_fast_division_is_ieee(inputs):
    """``_div_rn`` (reciprocal + two Newton-Markstein steps) against IEEE ``x / s`` for every bf16
    x (or random fp32 bit patterns) and scales from the smallest subnormal to near fp32 max: the
    same fp32 bits wherever 2^-80 <= |x / s| < 2^100; below, a quotient of the same sign under
    2^-79 (every float8 format rounds it to a signed 0); above, the same sign and >= 2^99 (it
    saturates); NaN exactly where the quotient is NaN. The ``div.rn`` path is bit-exact everywhere."""
    g = torch.Generator().manual_seed(21)
    if inputs == "all bf16":
        x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    else:
        x = torch.randint(-2 ** 31, 2 ** 31, (65536,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    amax = torch.rand(40, generator=g) * torch.exp2(torch.randint(-60, 60, (40,), generator=g).float())
    special = torch.tensor([2.0 ** -149, 1e-41, 2.0 ** -126, 1.1754942e-38, 1.0, 2.0 ** -7, 1.9999999, 3.0e38,
                            1.7014118e38, 2.0 ** 100, 0.75, 1.0 / 3.0, 5e-30, 448.0, 57344.0, 6.0 * 448.0,
                            2.0 ** -100, 1.5 * 2.0 ** -140, 0.0009765625, 2.0 ** 63, 7.0, 1.0000001, 0.99999994,
                            3.4e38])
    s = torch.cat([special, amax / 448.0]).float()
    ref = x[None, :] / s[:, None]
    assert_bits(_div_probe(x, s, False), ref, "div_rn path")
    got = _div_probe(x, s, True)
    a = ref.abs()
    mid = (a >= 2.0 ** -80) & (a < 2.0 ** 100)
    assert_bits(got[mid], ref[mid], "fast division, 2^-80 <= |q| < 2^100")
    sign = lambda t: _bits(t) < 0  # noqa: E731
    lo, hi, nan = a < 2.0 ** -80, a >= 2.0 ** 100, torch.isnan(ref)
    assert torch.equal(torch.isnan(got), nan)
    assert bool((got[lo].abs() < 2.0 ** -79).all()) and torch.equal(sign(got[lo]), sign(ref[lo]))
    assert bool((got[hi & ~nan].abs() >= 2.0 ** 99).all()) and torch.equal(sign(got[hi & ~nan]), sign(ref[hi & ~nan]))
    assert int(mid.sum()) > 2_000_000 and int(lo.sum()) > 1000 and int(hi.sum()) > 1000  # every range is exercised


# ---- FP4 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FP4_RECIPES)
def test_fp4_bit_exact_with_hadamard_and_sr(name):
    x = specials((37, 288), seed=8)
    for role in ROLES:
        for signs in (None, random_signs(role == "grad")):
            check_fp4(x, FP4_RECIPES[name], role, signs, seed=3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fp4_input_dtypes(dtype):
    x = specials((20, 96), dtype, seed=9)
    check_fp4(x, NV(), "grad", random_signs(1))
    check_fp4(x, MX(elem="e2m1", scale_rule="rceil"), "input")


def test_fp4_hadamard_follows_the_butterfly_order():
    """Wide-range inputs, so the fp32 sums of the transform round and their order shows."""
    g = torch.Generator().manual_seed(14)
    x = torch.randn(24, 64, generator=g) * torch.exp2(torch.randint(-30, 30, (24, 64), generator=g).float())
    signs = random_signs(2)
    y = x.reshape(-1, 16) * signs  # the butterfly in the other stride order (8, 4, 2, 1) rounds differently
    for h in (8, 4, 2, 1):
        y = y.reshape(-1, 16 // (2 * h), 2, h)
        y = torch.stack((y[:, :, 0] + y[:, :, 1], y[:, :, 0] - y[:, :, 1]), dim=2)
    assert not torch.equal(y.reshape(x.shape) * 0.25, hadamard16(x, signs))
    for dtype in (torch.float32, torch.bfloat16):
        check_fp4(x.to(dtype), NV(), "grad", signs)
        check_fp4(x.to(dtype), MX(elem="e2m1"), "input", signs)


def test_fp4_stochastic_rounding_reproducible_and_seeded():
    x = specials((16, 128), seed=10)
    a = check_fp4(x, NV(), "grad", seed=1)
    b = check_fp4(x, NV(), "grad", seed=1)
    c = check_fp4(x, NV(), "grad", seed=2)
    rne = check_fp4(x, NV(sr_grads=False), "grad")
    assert torch.equal(a._qdata, b._qdata) and not torch.equal(a._qdata, c._qdata)
    assert not torch.equal(a._qdata, rne._qdata)


def test_fp4_philox_stochastic_rounding_bit_exact_and_keyed():
    """Counter-based SR draws made in the kernel (no tensor of uniforms): the reference's codes,
    bit for bit, for ragged, 3-D and transposed inputs, with and without the Hadamard transform;
    another step or stream draws anew, the same key the same."""
    from lowbit.dtypes.philox import Philox
    key = torch.tensor([5, 2 ** 32 + 3])  # a step above 2^32: both counter words in use
    for x, signs in ((specials((150, 400), seed=20), None), (specials((3, 4, 64), seed=21), random_signs(2)),
                     (specials((96, 48), seed=22).t(), random_signs(3))):
        for dtype in (torch.float32, torch.bfloat16):
            xd = x.to(dtype)
            ref = cast.quantize_fp4(xd, NV(), "grad", Philox(key, 1), signs, backend="torch")
            got = TRITON_BACKEND.quantize_fp4(xd, NV(), "grad", Philox(key, 1), signs)
            assert_fp4(got, ref, f"philox {tuple(x.shape)} {dtype} hadamard={signs is not None}")
    x = specials((64, 128), seed=23)
    a = TRITON_BACKEND.quantize_fp4(x, NV(), "grad", Philox(key, 0))
    assert torch.equal(a._qdata, TRITON_BACKEND.quantize_fp4(x, NV(), "grad", Philox(key.clone(), 0))._qdata)
    for other in (Philox(key, 1), Philox(key + torch.tensor([0, 1]), 0)):
        assert not torch.equal(a._qdata, TRITON_BACKEND.quantize_fp4(x, NV(), "grad", other)._qdata)


def test_fp4_layouts_edges_and_tiles():
    base = specials((96, 40), seed=11)
    for x in (base.t(), specials((3, 4, 64), seed=12), base[0].contiguous(), torch.zeros(8, 32),
              torch.tensor([[float("nan"), float("inf")] * 16]), _edge_tensors()["ties"] / 64):
        check_fp4(x, NV(), "input")
        check_fp4(x, MX(elem="e2m1"), "input")
    check_fp4(specials((150, 400), seed=13), NV(), "grad", random_signs(5))  # many tiles


# ---- declines -------------------------------------------------------------------------------

def test_declines_return_none(monkeypatch):
    x = specials((8, 64))
    be = TRITON_BACKEND
    fp8, fp8_t, fp4 = be.quantize_fp8, be.quantize_fp8_t, be.quantize_fp4

    class MyCurrent(Current):
        pass

    for bad in (torch.ones(8, 64, dtype=torch.int32), x.double(), torch.empty(0, 64), torch.tensor(1.0), "x"):
        assert fp8(bad, Current(), "input") is None and fp4(bad, NV(), "input") is None
    assert fp8_t(bad, Current(), "input") is None
    for recipe, role in ((NV(), "input"), (MX(elem="e2m1"), "input"), (MX(grad_elem="e2m1"), "grad"),
                         (Delayed(), "input"), (MyCurrent(), "input"), (Current(), "bias"),
                         (Blockwise(act=(1, 96)), "input"), (Blockwise(act=(1, 256)), "input"),
                         (Blockwise(act=(1, -1)), "input")):
        assert fp8(x, recipe, role) is None, recipe
    assert fp8(specials((2, 128, 128)), Blockwise(), "weight") is None  # 2-D blocks need 2-D data
    assert fp8_t(specials((2, 8, 64)), Current(), "input") is None
    assert fp4(specials((2, 16, 64)), NV(), "weight") is None
    assert fp4(specials((8, 63)), NV(), "input") is None  # odd last dim: the reference raises
    assert fp4(specials((8, 40)), NV(), "input", None, random_signs(0)) is None  # 40 % 16
    assert fp4(x, NV(), "input", None, random_signs(0).double()) is None
    assert fp4(x, NV(), "input", None, torch.ones(8)) is None
    assert fp4(x, Current(), "input") is None and fp4(x, MX(), "input") is None
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # CPU without the interpreter: decline, never crash
    assert fp8(x, Current(), "input") is None and fp8_t(x, Current(), "input") is None
    assert fp4(x, NV(), "input") is None


# ---- compile configurations ---------------------------------------------------------------------

def test_scan_specs_one_per_kernel_and_complete():
    import inspect
    kernel_modules = (quantize_fp8_tensor_row_kernels, quantize_fp8_block_kernels, quantize_fp8_rowwise_t_kernels,
                      quantize_fp8_cols_t_kernels, quantize_fp8_rowblock_kernels, quantize_fp4_kernels,
                      quantize_fp4_pairs_kernels)
    for mod in kernel_modules:
        kernels = {n for n, v in vars(mod).items() if n.endswith("_kernel") and hasattr(v, "fn")}
        assert sorted(s["kernel"].fn.__name__ for s in mod.SCAN_SPECS) == sorted(kernels)
        for spec in mod.SCAN_SPECS:
            params = inspect.signature(spec["kernel"].fn).parameters
            assert list(spec["signature"]) == [p for p in params if p in spec["signature"]]
            assert set(spec["signature"]) == set(params)
            assert {p for p in params if spec["signature"][p] == "constexpr"} == set(spec["constexprs"])
    assert not [n for n in vars(quantize_jit_helpers) if n.endswith("_kernel")]  # helpers only: no launches


_PTX_SCRIPT = textwrap.dedent("""
    import json, triton
    from triton.compiler import ASTSource
    from triton.backends.compiler import GPUTarget
    from lowbit.kernels.triton.cast_fp4 import kernels as k4
    from lowbit.kernels.triton.cast_fp8 import tensorwise as k8
    from lowbit.kernels.triton import jit_common as kh
    E4M3 = dict(FMAX=448.0, EMIN=-6, MBITS=3, IS_E4M3=True)
    i32 = dict.fromkeys(("R", "C", "sxr", "sxc"), "i32")
    out = []
    for fast in (False, True):
        specs = [
            kh.scan_spec(k8._cast_tensor_kernel, {"x_ptr": "*fp32", "q_ptr": "*u8",
                         "scale_ptr": "*fp32", "amax_ptr": "*fp32", **i32, "sqr": "i32", "sqc": "i32",
                         "n_tiles_c": "i32", "n_tiles": "i32", "n_amax": "i32"},
                         dict(IN_BF16=False, DELAYED=False, HW_CVT=1, FAST_DIV=fast, FLAT=True, BLOCK_R=4,
                              BLOCK_C=64, LEAN=False, AMAX_SLOTS=False, AMAX_BLOCK=1, AMAX_VEC=1, PREFETCH=False,
                              **E4M3)),
            kh.scan_spec(k4._fp4_cast_kernel, {"x_ptr": "*fp32", "signs_ptr": "*fp32", "u_ptr": "*i64",
                         "amax_ptr": "*fp32", "q_ptr": "*u8", "s_ptr": "*u8", "g_ptr": "*fp32", **i32, "n_sc": "i32"},
                         dict(IN_KIND=0, HADAMARD=True, NV=True, STOCHASTIC=True, RCEIL=False, FAST_DIV=fast, BR=1,
                              BC=16, TILE_R=2, TILE_C=64, PHILOX=True, STREAM=1)),
        ]
        for s in specs:
            src = ASTSource(s["kernel"], s["signature"], constexprs=s["constexprs"])
            out.append(triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                      options={"enable_fp_fusion": False, "num_warps": 1}).asm["ptx"])
    print(json.dumps(out))
""")


def test_sm90_ptx_divides_exactly_and_casts_with_rne():
    """The GPU path's bit-exactness rests on these instructions: IEEE ``div.rn.f32`` (Triton's ``/``
    is the approximate ``div.full.f32``), the saturating RNE float8 cast, and no contraction: the
    only fma are the four of each fast division, whose per-element ``div.rn`` is gone (the tensor
    scale keeps two: amax / fmax and its reciprocal)."""
    import json
    import lowbit
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(lowbit.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    env["TRITON_DEFAULT_FP_FUSION"] = "0"
    res = subprocess.run([sys.executable, "-c", _PTX_SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    fp8_ptx, fp4_ptx, fp8_fast, fp4_fast = json.loads(res.stdout.strip().splitlines()[-1])
    n_elem = 4 * 64 // 32  # elements per thread of the fp8 tile (one warp)
    for ptx in (fp8_ptx, fp4_ptx, fp8_fast, fp4_fast):
        assert "div.rn.f32" in ptx
        assert "div.full" not in ptx and "div.approx" not in ptx
    assert "fma.rn.f32" not in fp8_ptx and "fma.rn.f32" not in fp4_ptx
    assert fp8_ptx.count("div.rn.f32") >= n_elem
    assert fp8_fast.count("div.rn.f32") == 2  # amax / fmax and the reciprocal of the scale
    assert fp8_fast.count("fma.rn.f32") == 4 * n_elem
    assert fp4_fast.count("fma.rn.f32") % 4 == 0 and fp4_fast.count("fma.rn.f32") > 0
    assert "cvt.rn.satfinite.e4m3x2.f32" in fp8_ptx and "cvt.rn.satfinite.e4m3x2.f32" in fp8_fast

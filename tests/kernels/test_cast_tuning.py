"""The cast tuning table (``lowbit.kernels.triton.cast_fp8.tuning``): each field's alternative
values bit-exact with the torch reference on the Triton CPU interpreter, through a backend built
with the override (the geometry and code-path fields; the GPU-only ones, ``cvt_handles_nan``
and the register caps, change nothing under the interpreter, which rounds with the arithmetic
path: ``benchmarks/quantize.py --sweep`` checks those on the GPU before it times them); the lean
float8 encode exhaustively over bf16 inputs; delayed scaling with amax slots (state, odd scales,
state_dict round trip); and the vector widths of the streaming casts as compiled for sm_90.
"""
import textwrap

import pytest
import torch
import triton
import triton.language as tl

from lowbit.dtypes.formats import E4M3, E5M2
from lowbit.dtypes.fp8_tensor import FP8Tensor
from lowbit.dtypes.quantize import quantize
from lowbit.kernels import api as cast
from lowbit.kernels.triton import TRITON_BACKEND
from lowbit.kernels.triton import jit_common as kh
from lowbit.scaling.delayed import DelayedScalingState
from lowbit.scaling.recipes import MX, NV, Blockwise, Current, Delayed, Rowwise
from sm90 import run_script
from test_cast_fp8 import assert_bits, assert_fp8, backend, check_fp4, check_fp8, launched, specials

# name -> CastTuning overrides: every field whose other values take another code path or geometry
LEVERS = {
    "plain encode, div.rn": dict(lean_encode=False, fast_div=False),
    "amax forward walk": dict(amax_reverse=False),
    "tiles 2048, one program": dict(tile_elems_interpreted=2048, interpreted_programs=1),
    "tiles 8192, seven programs": dict(tile_elems_interpreted=8192, interpreted_programs=7),
    "block chunks 1": dict(block_chunks=1),
    "block chunks 8": dict(block_chunks=8),
    "transpose 16x32, slots by 16": dict(transpose_tile=(16, 32), amax_reduce_block=16),
    "rowlocal no prefetch, no finite": dict(rowlocal_prefetch=False, rowlocal_finite_tiles=False),
    "rowlocal 1024, long rows": dict(tile_elems_interpreted=1024, rowlocal_max_cols=128),
}

# bf16 bit patterns: -qNaN, NaNs with payloads (both signs), +-inf, +-0, +-smallest subnormal,
# +-largest subnormal, +-max, the E4M3 / E5M2 saturation edges
_BF16_BITS = (0xFFC0, 0x7F81, 0xFF81, 0x7FFF, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x807F,
              0x7F7F, 0xFF7F, 0x43E0, 0xC3E0, 0x43E1, 0x4760, 0xC761)


def specials_bits(shape, dtype=torch.bfloat16, seed=0):
    """``specials`` with the raw bf16 patterns above spread through it (a NaN's sign bit and
    payload survive: no float conversion touches them; fp32/fp16 get the exact bf16 values)."""
    x = specials(shape, seed=seed)
    bits = x.view(torch.int16).view(-1)
    for i, b in enumerate(_BF16_BITS):
        bits[(i * 6133 + 5) % bits.numel()] = b - 65536 if b >= 32768 else b
    if dtype == torch.bfloat16:
        return x
    f = (x.view(torch.int16).to(torch.int32) << 16).view(torch.float32)  # exact, NaN bits kept
    return f if dtype == torch.float32 else f.to(dtype)


def _delayed_steps(x_steps, recipe, role, what, be=TRITON_BACKEND):
    ref_state, state = (DelayedScalingState(recipe, recipe.format(role)) for _ in range(2))
    for step, (x, transposed) in enumerate(x_steps):
        if transposed:
            q, qt = be.quantize_fp8_t(x, recipe, role, state)
            rq, rqt = cast.quantize_fp8_t(x, recipe, role, ref_state, backend="torch")
            assert_fp8(qt, rqt, f"{what} step {step} q_t")
        else:
            q = be.quantize_fp8(x, recipe, role, state)
            rq = FP8Tensor.from_float(x, recipe, role, state=ref_state)
        assert_fp8(q, rq, f"{what} step {step}")
        assert_bits(state.amax_history, ref_state.amax_history, f"{what} step {step} amax history")
        assert_bits(state.scale, ref_state.scale, f"{what} step {step} state scale")
    return state, ref_state


@pytest.mark.parametrize("lever", list(LEVERS))
def test_lever_bit_exact(lever):
    be = backend(**LEVERS[lever])
    x = specials_bits((37, 300), seed=30)  # partial tiles and blocks
    big = specials_bits((96, 700), seed=31)  # several tiles a program
    recipe = Delayed(history_len=2, margin=1)
    _delayed_steps([(x, False), (big * 8, False), (x, True)], recipe, "input", lever, be)
    _delayed_steps([(specials_bits((33, 160), torch.float16, seed=32), False)], Delayed(amax_algo="most_recent"),
                   "grad", lever, be)
    for xx in (x, specials_bits((33, 160), torch.float32, seed=33)):
        check_fp8(xx, Current(), "input", be=be)
        check_fp8(xx, Current(), "grad", transposed=True, be=be)
        check_fp8(xx, Rowwise(), "input", be=be)
        check_fp8(xx, MX(elem="e5m2", scale_rule="rceil"), "grad", be=be)
    check_fp8(x, Rowwise(), "grad", transposed=True, be=be)
    check_fp8(x, Blockwise(), "input", transposed=True, be=be)
    check_fp8(x, Blockwise(), "weight", transposed=True, be=be)
    check_fp8(x, Blockwise(), "weight", be=be)
    check_fp4(x[:, :288], MX(elem="e2m1"), "input", be=be)
    check_fp4(x[:, :288], NV(), "input", be=be)


@pytest.mark.parametrize("lean", [False, True])
def test_delayed_odd_state_scales(lean):
    """A state scale of 0, inf, the smallest subnormal or near fp32 max (a loaded state_dict may
    hold one): quotients of +-inf, NaN (0/0, inf/inf) and +-0, as the reference's division."""
    be = backend(lean_encode=lean)
    x = specials_bits((16, 96), seed=35)
    for s in (0.0, float("inf"), 2.0 ** -149, 3.4e38, 1e-30, 7.0):
        recipe = Delayed(history_len=1)
        state, ref_state = DelayedScalingState(recipe, E4M3), DelayedScalingState(recipe, E4M3)
        state.scale.fill_(s)
        ref_state.scale.fill_(s)
        assert_fp8(be.quantize_fp8(x, recipe, "input", state),
                   FP8Tensor.from_float(x, recipe, "input", state=ref_state), f"scale {s}")
        assert_bits(state.scale, ref_state.scale, "state scale")


def test_delayed_amax_slots_state_dict_round_trip():
    """With the amax in slots the state is what it was: the same two buffers in the state_dict, and
    a state loaded from it continues exactly as the reference's."""
    recipe = Delayed(history_len=3)
    x0, x1 = specials_bits((40, 200), seed=36), specials_bits((40, 200), seed=37) * 16
    state, ref_state = _delayed_steps([(x0, False), (x1, False)], recipe, "input", "before")
    sd = state.state_dict()
    assert sorted(sd) == ["amax_history", "scale"] and sorted(sd) == sorted(ref_state.state_dict())
    for k in sd:
        assert_bits(sd[k], ref_state.state_dict()[k], k)
    loaded, ref_loaded = DelayedScalingState(recipe, E4M3), DelayedScalingState(recipe, E4M3)
    loaded.load_state_dict(sd)
    ref_loaded.load_state_dict(ref_state.state_dict())
    assert bool(loaded.primed) == bool(ref_loaded.primed)
    for step in range(2):
        xs = specials_bits((40, 200), seed=38 + step)
        assert_fp8(TRITON_BACKEND.quantize_fp8(xs, recipe, "input", loaded),
                   FP8Tensor.from_float(xs, recipe, "input", state=ref_loaded), f"after load, step {step}")
        assert_bits(loaded.amax_history, ref_loaded.amax_history, "amax history")
        assert_bits(loaded.scale, ref_loaded.scale, "state scale")


@triton.jit
def _code_probe_kernel(x_ptr, s_ptr, out_ptr, N, S: tl.constexpr, BLOCK: tl.constexpr, FAST_DIV: tl.constexpr,
                       LEAN: tl.constexpr, FMAX: tl.constexpr, EMIN: tl.constexpr, MBITS: tl.constexpr,
                       IS_E4M3: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=1.0)
    s = tl.load(s_ptr + tl.arange(0, S))
    p2k, sp, ys = kh._div_parts(s, FAST_DIV)
    q = kh._quantize_fp8(x[None, :], p2k[:, None], sp[:, None], ys[:, None], FMAX, EMIN, MBITS, IS_E4M3, 0, FAST_DIV,
                         LEAN)
    tl.store(out_ptr + tl.arange(0, S)[:, None] * N + offs[None, :], q, mask=(offs < N)[None, :])


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=lambda f: f.name)
def test_lean_codes_every_bf16(fmt):
    """The lean path's codes (fast division and ``div.rn``) against ``quantize(x, fmt, s)`` for every
    bf16 x (NaNs with either sign included) and scales from the smallest subnormal to near fp32 max,
    0 and inf."""
    g = torch.Generator().manual_seed(40)
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    special = torch.tensor([2.0 ** -149, 1e-41, 2.0 ** -126, 1.0, 2.0 ** -7, 1.9999999, 3.0e38, 2.0 ** 100, 1.0 / 3.0,
                            5e-30, 448.0, 57344.0, 2.0 ** -100, 1.5 * 2.0 ** -140, 0.0, float("inf")])
    amax = torch.rand(16, generator=g) * torch.exp2(torch.randint(-60, 60, (16,), generator=g).float())
    s = torch.cat([special, amax / fmt.max]).float()
    ref = quantize(x[None, :], fmt, s[:, None]).view(torch.uint8)
    for fast in (True, False):
        out = torch.empty(s.numel(), x.numel(), dtype=torch.uint8)
        _code_probe_kernel[(triton.cdiv(x.numel(), 8192),)](
            x, s, out, x.numel(), S=s.numel(), BLOCK=8192, FAST_DIV=fast, LEAN=True, FMAX=fmt.max, EMIN=fmt.emin,
            MBITS=fmt.mbits, IS_E4M3=fmt.name == "e4m3")
        assert_bits(out, ref, f"lean codes, fast division {fast}")


_STREAM_SCRIPT = textwrap.dedent("""
    import json, sys
    from benchmarks.quantize_sass import profile_rows
    print(json.dumps(profile_rows(["delayed e4m3", "current e4m3"], (16384, 4096), json.loads(sys.argv[1]))))
""")


@pytest.mark.parametrize("sets, widths", [([], ([16], [16])), (["tile_elems=1024", "lean_encode=False"], ([16], [8])),
                                          (["tile_elems=8192"], ([16], [16]))])
def test_sm90_stream_casts_vector_widths(sets, widths):
    """The streaming casts as launched for a 16384x4096 bf16 input on an H200 (compiled for sm_90,
    benchmarks/quantize_sass.py): 16-byte loads, and 8-byte stores at 8 elements a thread or
    16-byte ones at 16 (``st.global.v4.b32``); no spills."""
    import json
    rows = run_script(_STREAM_SCRIPT, json.dumps(sets))
    assert [r["kernel"] for r in rows] == ["_cast_tensor_kernel", "_amax_kernel", "_cast_tensor_kernel"], rows
    for r in rows:
        assert r["stack"] == 0 and r["ld_widths"] == widths[0] and r["ptx_ld_v4"], r
        if r["kernel"] == "_cast_tensor_kernel":
            assert r["st_widths"] == widths[1] and r["ptx_st_v4"] == (widths[1] == [16]), r


_LEAN_PTX_SCRIPT = textwrap.dedent("""
    import json, triton
    from triton.compiler import ASTSource
    from triton.backends.compiler import GPUTarget
    from lowbit.kernels.triton.cast_fp8 import tensorwise as k8
    from lowbit.kernels.triton import jit_common as kh
    sig = {"x_ptr": "*i16", "q_ptr": "*u8", "scale_ptr": "*fp32", "amax_ptr": "*fp32",
           **dict.fromkeys(("R", "C", "sxr", "sxc", "sqr", "sqc", "n_tiles_c", "n_tiles", "n_amax"), "i32")}
    out = []
    for hw in (1, 3):
        s = kh.scan_spec(k8._cast_tensor_kernel, sig, dict(
            IN_BF16=True, DELAYED=False, FMAX=448.0, EMIN=-6, MBITS=3, IS_E4M3=True, HW_CVT=hw,
            FAST_DIV=True, FLAT=True, BLOCK_R=4, BLOCK_C=64, LEAN=True, AMAX_SLOTS=False, AMAX_BLOCK=1,
            AMAX_VEC=1, PREFETCH=False))
        src = ASTSource(s["kernel"], s["signature"], constexprs=s["constexprs"])
        out.append(triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                  options={"enable_fp_fusion": False, "num_warps": 1}).asm["ptx"])
    print(json.dumps(out))
""")


def test_sm90_lean_cast_ptx():
    """The lean path compiled for sm_90: the four fma of each fast division and no other (no
    contraction), the two per-scale divisions, the RNE saturating float8 cast; ``cvt_handles_nan``
    (HW_CVT 3) hands NaN to the cast through ``min.NaN`` instead of testing for it."""
    ptx_hw1, ptx_hw3 = run_script(_LEAN_PTX_SCRIPT)
    n_elem = 4 * 64 // 32  # elements a thread (one warp)
    for ptx in (ptx_hw1, ptx_hw3):
        assert ptx.count("fma.rn.f32") == 4 * n_elem and ptx.count("div.rn.f32") == 2
        assert "div.full" not in ptx and "div.approx" not in ptx
        assert "cvt.rn.satfinite.e4m3x2.f32" in ptx
    assert "min.NaN.f32" in ptx_hw3 and "min.NaN.f32" not in ptx_hw1
    assert "setp.nan.f32" in ptx_hw1 or "setp.num.f32" in ptx_hw1 or "setp.neu.f32" in ptx_hw1


# ---- the row-local walk (quantize_fp8_rowblock_kernels) ------------------------------------------

def _rowlocal_inputs(seed, transposed):
    """The row-local casts' inputs: special blocks in bf16 / fp16 / fp32, ``transposed``, a column
    slice, a 3-D tensor, long ragged rows, and an all-finite tensor (the finite-tile path)."""
    base = _special_blocks(384, seed=seed)
    return [base, _special_blocks(200, torch.float16, seed=seed + 1), _special_blocks(300, torch.float32, seed=seed + 2),
            transposed, base[:, 40:340], specials_bits((2, 3, 256), seed=seed + 4),
            specials_bits((70, 1100), seed=seed + 5), torch.randn(40, 256).to(torch.bfloat16)]


def _special_blocks(C, dtype=torch.bfloat16, seed=0):
    """Rows of ``specials_bits`` with whole 32-element runs (so whole MX, 1x32 and 1x128 blocks, and
    for rowwise whole rows) that are all NaN, all +-inf, NaN and inf mixed, all +-0, all bf16
    subnormals, one NaN among small values, inf among normal values, and the saturation edges."""
    x = specials_bits((9, C), torch.float32, seed=seed)
    sub = (torch.arange(1, 33, dtype=torch.int32) << 16).view(torch.float32)  # bf16 subnormals, exact
    runs = (torch.full((32,), float("nan")), torch.full((32,), -float("inf")),
            torch.tensor([float("nan"), float("inf")] * 16), torch.zeros(32), -torch.zeros(32), sub,
            torch.cat([torch.full((31,), 1e-3), torch.tensor([float("nan")])]))
    for i, run in enumerate(runs):
        x[i % 9, (i * 32) % (C - 31):(i * 32) % (C - 31) + 32] = run
    x[7] = torch.where(torch.arange(C) % 5 == 0, float("inf"), x[7])
    x[8] = torch.tensor([448.0, -448.0, 464.0, 57344.0, -61440.0, 1e-38, 2.0 ** -140, 3.0e38])[torch.arange(C) % 8]
    x = x.to(dtype)
    if dtype == torch.float32:  # the NaNs next to +-inf: payload 1, either sign
        x.view(torch.int32)[4, 3], x.view(torch.int32)[5, C - 2] = 0x7F800001, -0x7FFFFF  # 0xFF800001
    return x


_ROWLOCAL_RECIPES = ((Rowwise(), "input"), (Rowwise(), "grad"), (Blockwise(), "input"),
                     (Blockwise(act=(1, 32)), "grad"), (MX(), "input"), (MX(elem="e5m2", scale_rule="rceil"), "grad"),
                     (MX(scale_rule="rceil"), "input"), (MX(elem="e5m2"), "grad"))


@pytest.mark.parametrize("prefetch, finite", [(True, True), (False, False)])
def test_rowlocal_bit_exact_and_launched(prefetch, finite, monkeypatch):
    """The row-local kernel (and no other cast) launched for rowwise, 1x128, 1x32 and MX blocks,
    bit-exact with the reference for bf16 / fp16 / fp32, E4M3 and E5M2, MX floor and rceil, ragged
    shapes (C not a multiple of the block, nor of 16), blocks that are all NaN / inf / zero /
    subnormal, non-contiguous and 3-D inputs; one program or several, several tiles a program."""
    be = backend(rowlocal_prefetch=prefetch, rowlocal_finite_tiles=finite)
    seen = launched(monkeypatch)
    xs = _rowlocal_inputs(50, _special_blocks(100, seed=53).t())
    base = xs[0]
    for x in xs:
        for recipe, role in _ROWLOCAL_RECIPES:
            seen.clear()
            check_fp8(x, recipe, role, be=be)
            assert [s[0] for s in seen] == ["_cast_rowblock_kernel"], (x.shape, recipe, seen)
            assert seen[0][2]["PREFETCH"] == prefetch and seen[0][2]["FINITE"] == finite
            assert seen[0][2]["maxnreg"] == 48
    flat = {}
    for x, flat_expected in ((base, True), (base[:, 40:340], False)):
        seen.clear()
        check_fp8(x, Blockwise(), "input", be=be)
        assert seen[0][2]["FLAT"] == flat_expected and seen[0][2]["BC"] == 128, seen
        flat[flat_expected] = seen[0][2]
    assert flat[True]["TR"] == 32 and flat[True]["MX"] is False  # 27 groups: one tile, clipped to 32 groups


def test_long_rows_and_other_blocks_keep_their_kernels(monkeypatch):
    """Rows longer than ``rowlocal_max_cols`` take ``_cast_rows_kernel``; 2-D blocks and blocks
    narrower than 16 (with or without the transposed copy) ``_cast_blocks_kernel``; bit-exact."""
    seen = launched(monkeypatch)
    x = specials_bits((20, 256), seed=56)
    for recipe in (Rowwise(), Blockwise(), MX()):
        seen.clear()
        check_fp8(x, recipe, "input")
        assert [s[0] for s in seen] == ["_cast_rowblock_kernel"], (recipe, seen)
    be = backend(rowlocal_max_cols=128)
    for recipe, role, kernel, t in ((Rowwise(), "input", "_cast_rows_kernel", False),
                                    (Blockwise(), "weight", "_cast_blocks_kernel", False),
                                    (Blockwise(act=(1, 8)), "input", "_cast_blocks_kernel", False),
                                    (Blockwise(act=(1, 8)), "grad", "_cast_blocks_kernel", True)):
        seen.clear()
        check_fp8(x, recipe, role, transposed=t, be=be)
        assert [s[0] for s in seen] == [kernel], (recipe, role, seen)


@pytest.mark.parametrize("pairs", [False, True])
def test_rowlocal_fp4_bit_exact_and_launched(pairs, monkeypatch):
    """MX E2M1 (floor and rceil, 1x32 and 1x16 blocks) by ``_mx_fp4_rowblock_kernel``, or with
    ``fp4_pairs`` by ``_mx_fp4_pairs_kernel`` where x is contiguous bf16 with whole blocks a row,
    bit-exact with the reference (data, E8M0 scales, global scale) for bf16 / fp16 / fp32, blocks
    that are all NaN / inf / zero / subnormal, ragged, non-contiguous and 3-D inputs; with the
    Hadamard transform ``_fp4_cast_kernel``."""
    from lowbit.scaling.hadamard import random_signs
    be = backend(fp4_pairs=pairs)
    seen = launched(monkeypatch)
    xs = _rowlocal_inputs(60, specials_bits((10, 100), seed=63).t())
    base = xs[0]
    n_pairs = 0
    for x in xs:
        for recipe in (MX(elem="e2m1"), MX(elem="e2m1", scale_rule="rceil"), MX(block=16, elem="e2m1")):
            seen.clear()
            check_fp4(x, recipe, "input", be=be)
            bc = recipe.granularity("input").cols
            if pairs and x.dtype == torch.bfloat16 and x.is_contiguous() and x.shape[-1] % bc == 0:
                assert [(s[0], s[2]["ASM"]) for s in seen] == [("_mx_fp4_pairs_kernel", False)], seen
                n_pairs += 1
            else:
                assert [s[0] for s in seen] == ["_mx_fp4_rowblock_kernel"], seen
    assert n_pairs == (9 if pairs else 0)  # base, the 3-D and the all-finite tensor, three recipes each
    seen.clear()
    check_fp4(base, MX(elem="e2m1"), "input", random_signs(3), be=be)
    assert [s[0] for s in seen] == ["_fp4_cast_kernel"], seen


@pytest.mark.parametrize("pairs", [False, True])
def test_rowlocal_nvfp4_bit_exact_and_launched(pairs, monkeypatch):
    """NV E2M1 with 1x16 blocks by ``_nv_fp4_rowblock_kernel`` (with ``fp4_pairs``:
    ``_nv_fp4_pairs_kernel`` for contiguous bf16) after the tensor amax, bit-exact with the
    reference (data, UE4M3 block scales, FP32 tensor scale) on the inputs of the MX test (NaN / inf
    / zero / subnormal blocks, ragged, non-contiguous, 3-D; a tensor whose amax is inf: tensor
    scale 1); 16x16 weight blocks, stochastic rounding of gradients and the Hadamard transform keep
    ``_fp4_cast_kernel``."""
    from lowbit.scaling.hadamard import random_signs

    be = backend(fp4_pairs=pairs)
    seen = launched(monkeypatch)
    xs = _rowlocal_inputs(70, specials_bits((10, 100), seed=73).t())
    finite = xs[-1]
    n_pairs = 0
    for x in xs + [finite * 1e-30, torch.zeros(8, 64, dtype=torch.bfloat16), _special_blocks(64) * 1e-35]:
        seen.clear()
        check_fp4(x, NV(), "input", be=be)
        casts = [s for s in seen if s[0] not in ("_amax_kernel", "_nv_amax_kernel")]
        if pairs and x.dtype == torch.bfloat16 and x.is_contiguous() and x.shape[-1] % 16 == 0:
            assert [(s[0], s[2]["ASM"]) for s in casts] == [("_nv_fp4_pairs_kernel", False)], seen
            n_pairs += 1
        else:
            assert [s[0] for s in casts] == ["_nv_fp4_rowblock_kernel"], seen
    assert n_pairs == (6 if pairs else 0)
    for recipe, role, signs in ((NV(), "weight", None), (NV(), "grad", None), (NV(), "input", random_signs(5))):
        seen.clear()
        check_fp4(finite, recipe, role, signs, be=be)
        assert [s[0] for s in seen if s[0] not in ("_amax_kernel", "_nv_amax_kernel")] == ["_fp4_cast_kernel"], seen


_ROWLOCAL_SCRIPT = textwrap.dedent("""
    import json, sys
    from benchmarks.quantize_sass import profile_rows
    print(json.dumps(profile_rows(["rowwise e4m3", "block 1x128", "mxfp8 1x32"], (16384, 4096),
                                  json.loads(sys.argv[1]))))
""")


@pytest.mark.parametrize("sets", [[], ["rowlocal_prefetch=False"], ["rowlocal_maxnreg=None"]])
def test_sm90_rowlocal_geometry(sets):
    """The row-local casts as launched for a 16384x4096 bf16 input on an H200 (compiled for sm_90,
    benchmarks/quantize_sass.py): 8 warps, 16 elements a thread, 16-byte loads and 16-byte code
    stores, the load of the next tile issued ahead with ``rowlocal_prefetch``, the ``maxnreg``
    cap honoured (5 programs an SM); no spills without the cap (with it: none with triton 3.6,
    16 bytes for 1x128 with 3.9)."""
    import json
    rows = run_script(_ROWLOCAL_SCRIPT, json.dumps(sets))
    assert [r["kernel"] for r in rows] == ["_cast_rowblock_kernel"] * 3, rows
    for r in rows:
        assert r["warps"] == 8 and r["elems_thread"] == 16, r
        assert r["ld_widths"] == [16] and 16 in r["st_widths"] and r["ptx_st_v4"], r
        assert r["ahead"] == ("rowlocal_prefetch=False" not in sets), r
        if sets == ["rowlocal_maxnreg=None"]:
            assert r["stack"] == 0, r
        else:
            assert r["regs"] <= 48 and r["resident"] >= 5, r


_FP4_PAIRS_SCRIPT = textwrap.dedent("""
    import json, sys
    from benchmarks.quantize_sass import profile_rows
    print(json.dumps(profile_rows(["mxfp4 1x32", "nvfp4 1x16"], (16384, 4096), json.loads(sys.argv[1]))))
""")


@pytest.mark.parametrize("pairs", [True, False])
def test_sm90_fp4_pair_kernels(pairs):
    """The row-local FP4 casts as launched for a 16384x4096 bf16 input on an H200 (compiled for sm_90,
    benchmarks/quantize_sass.py): with ``fp4_pairs`` the pair kernels (8 warps, 16
    elements a thread, 16-byte word loads, 8-byte code stores, no stack), MX in <= 14 SASS
    instructions an element (PTX encode and bf16x2 amax) and NV in <= 28; the element kernels
    without it take more (MX >= 20, NV >= 40)."""
    import json
    rows = run_script(_FP4_PAIRS_SCRIPT, json.dumps([] if pairs else ["fp4_pairs=False"]))
    kernels = [r["kernel"] for r in rows]
    if pairs:
        assert kernels == ["_mx_fp4_pairs_kernel", "_amax_kernel", "_nv_fp4_pairs_kernel"], rows
        mx, nv = rows[0], rows[2]
        for r in (mx, nv):
            assert r["warps"] == 8 and r["elems_thread"] == 16 and r["stack"] == 0, r
            assert r["ld_widths"] == [16] and r["st_widths"] == [8], r
        assert mx["per_elem"] <= 14 and nv["per_elem"] <= 28, rows
    else:
        assert kernels == ["_mx_fp4_rowblock_kernel", "_amax_kernel", "_nv_fp4_rowblock_kernel"], rows
        assert rows[0]["per_elem"] >= 20 and rows[2]["per_elem"] >= 40, rows

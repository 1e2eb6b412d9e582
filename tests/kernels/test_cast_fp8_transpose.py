"""The FP8 casts with a transposed copy (``lowbit.kernels.triton.cast_fp8``: ``cols_t``,
``rowwise``, ``blocks``, ``tensorwise``): 1x128 (and 1x32) blocks, 128x128 blocks, rowwise and
tensorwise, each with its transposed copy, bit-exact with the torch reference on the Triton CPU
interpreter: ragged shapes (rows / columns not multiples of the tile), finite tiles (the fast
encode) and tiles holding NaN, +-inf, zero blocks and subnormal amax (the plain encode), bf16 /
fp16 / fp32 inputs, E4M3 and E5M2; and the casts as compiled for sm_90 (16-byte stores, no
spills).
"""
import textwrap

import pytest
import torch

from lowbit.dtypes.formats import E4M3
from lowbit.kernels import api as cast
from lowbit.scaling.delayed import DelayedScalingState
from lowbit.scaling.recipes import Blockwise, Current, Delayed, Rowwise
from sm90 import run_script
from test_cast_fp8 import assert_bits, assert_fp8, backend, check_fp8, launched, specials

RECIPES = {"block 1x128 e4m3": (Blockwise(), "input"), "block 1x128 grad e5m2": (Blockwise(grad_format="e5m2"), "grad"),
           "block 1x32": (Blockwise(act=(1, 32)), "input"), "rowwise e4m3": (Rowwise(), "input"),
           "rowwise grad e5m2": (Rowwise(), "grad")}


_TILES = ["split", "split-forward", "rowwise-sweep"]
_CASES = [(t, n) for t in _TILES for n in RECIPES if t != "rowwise-sweep" or n.startswith("rowwise")]


@pytest.fixture
def tiles(request):
    """(backend, the kernels that write the transposed copies, 1xBC then rowwise): the split casts
    (x's copy by the row-local cast, the transposed copy alone by ``_cast_cols_t_kernel``, walking
    last to first or first to last) or, for rows past ``rowlocal_max_cols``, the rowwise sweep
    kernels, at geometries that give several slices and programs."""
    be = backend(rowwise_t_amax_tile=(32, 8, 32), rowwise_t_sweep_rows=(32, 8), cols_t_cols=32, cols_t_rows=16,
                 cols_t_reverse=request.param != "split-forward",
                 rowlocal_max_cols=16 if request.param == "rowwise-sweep" else 8192)
    rowwise = "_cast_rowwise_t_sweep_kernel" if request.param == "rowwise-sweep" else "_cast_cols_t_kernel"
    return be, ("_cast_cols_t_kernel", rowwise)


def _finite(shape, dtype, seed):
    """Normal values over a wide range of binades (no special values): every tile takes the fast encode."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-20, 21, shape, generator=g).float())
    return x.to(dtype)


def _hard(shape, dtype, seed):
    """``specials`` (NaN, -NaN, +-inf, -0, subnormals) plus a zero block, an all-inf row strip, a
    block of fp32-subnormal amax, rounding ties and values at the saturation edge."""
    x = specials(shape, seed=seed).float()
    x[:5, :40] = 0.0
    x[-3:, :] = float("inf")
    x[7:9, :] = 1e-40 if dtype == torch.float32 else 2.0 ** -133  # subnormal amax (bf16 keeps 2^-133)
    x[10, :16] = torch.tensor([1.0625, 1.1875, 9.5, 432.0, 440.0, 447.9, -1.0625, 3.0e4] * 2)
    return x.to(dtype)


def _near_ties(shape, seed):
    """fp32 rows of ``RN(m * s)`` for E4M3 rounding midpoints m and an odd row scale s (the row's
    first element is its amax, ``448 * s``): quotients within ~2^-24 of a tie, where a division
    that is only faithful (one Newton step short) gives another code."""
    g = torch.Generator().manual_seed(seed)
    vals = torch.arange(0, 127, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (vals[:-1] + vals[1:]) / 2
    s = ((1 + torch.rand(shape[0], 1, generator=g)) * torch.exp2(torch.randint(-20, 20, (shape[0], 1), generator=g)))
    amax = (s.double() * 448).float()
    idx = torch.randint(0, mids.numel(), shape, generator=g)
    sign = torch.randint(0, 2, shape, generator=g).float() * 2 - 1
    x = mids[idx] * (amax / 448) * sign
    x[:, 0] = amax[:, 0]
    return x


@pytest.mark.parametrize("tiles, name", _CASES, indirect=["tiles"])
def test_tile_casts_bit_exact(name, tiles):
    be = tiles[0]
    recipe, role = RECIPES[name]
    cases = [((37, 300), torch.bfloat16), ((200, 130), torch.float32)]
    if name in ("block 1x128 e4m3", "rowwise e4m3"):
        cases += [((128, 256), torch.bfloat16), ((64, 96), torch.float16)]
    if recipe.format(role).name == "e4m3":
        x = _near_ties((64, 256), seed=30)
        check_fp8(x, recipe, role, transposed=True, be=be)
        check_fp8(x.t().contiguous(), recipe, role, transposed=True, be=be)
    for i, (shape, dtype) in enumerate(cases):
        check_fp8(_finite(shape, dtype, seed=i), recipe, role, transposed=True, be=be)
        check_fp8(_hard(shape, dtype, seed=10 + i), recipe, role, transposed=True, be=be)


@pytest.mark.parametrize("tiles", _TILES, indirect=True)
def test_tile_casts_layouts_and_single_tiles(tiles):
    """A transposed (non-contiguous) input; tensors smaller than a tile and than a block."""
    be = tiles[0]
    base = _finite((300, 40), torch.bfloat16, seed=20)
    for recipe, role in (RECIPES["block 1x128 e4m3"], RECIPES["rowwise e4m3"]):
        check_fp8(base.t(), recipe, role, transposed=True, be=be)
        check_fp8(_hard((16, 48), torch.bfloat16, seed=21), recipe, role, transposed=True, be=be)
        check_fp8(torch.zeros(24, 128), recipe, role, transposed=True, be=be)


@pytest.mark.parametrize("tiles", _TILES, indirect=True)
def test_tile_casts_are_the_launched_kernels(tiles, monkeypatch):
    """The tests above run the kernels ``tiles`` names for the transposed copies: a guard against
    testing another path."""
    be, kernels = tiles
    seen = launched(monkeypatch)
    x = _finite((40, 130), torch.bfloat16, seed=22)
    check_fp8(x, *RECIPES["block 1x128 e4m3"], transposed=True, be=be)
    n_block = len(seen)
    check_fp8(x, *RECIPES["rowwise e4m3"], transposed=True, be=be)
    assert seen[n_block - 1][0] == kernels[0] and seen[-1][0] == kernels[1], [s[0] for s in seen]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_square_block_cast_bit_exact(dtype, monkeypatch):
    """128x128 blocks with the transposed copy by ``_cast_square_t_reg_kernel`` (the block held in
    registers; q's codes and scales transposed): ragged blocks both ways, finite and hard (NaN,
    inf, zero, subnormal-amax) blocks, a transposed input; the launch is that kernel's (a guard
    against testing another path)."""
    seen = launched(monkeypatch)
    recipe = Blockwise()
    check_fp8(_finite((300, 260), dtype, seed=40), recipe, "weight", transposed=True)
    check_fp8(_hard((130, 384), dtype, seed=41), recipe, "weight", transposed=True)
    check_fp8(_hard((260, 200), dtype, seed=42).t(), recipe, "weight", transposed=True)
    assert [(s[0], s[1]) for s in seen] == [("_cast_square_t_reg_kernel", g) for g in ((9,), (6,), (6,))]


def test_tensorwise_t_casts_bit_exact(monkeypatch):
    """Tensorwise casts with the transposed copy by ``_cast_tensor_t_reg_kernel`` (16x32 tiles:
    many programs, ragged tiles): delayed scaling with state scales whose quotients overflow past
    the kernel's 2^99 guard of its finite encode (1e-30, the smallest subnormal), saturate, or are
    0 / inf / NaN, on finite tiles and tiles holding NaN / inf; the state after each step (the amax
    slots reduced 16 at a time); current scaling; the launch is that kernel's."""
    be = backend(transpose_tile=(16, 32), amax_reduce_block=16)
    seen = launched(monkeypatch)
    finite, hard = _finite((70, 200), torch.bfloat16, seed=50), _hard((70, 200), torch.bfloat16, seed=51)
    for x in (finite, hard, finite.float() * 2.0 ** 90):
        for s in (7.0, 1e-30, 2.0 ** -149, 3.4e38, 0.0, float("inf"), float("nan")):
            recipe = Delayed(history_len=2)
            state, ref_state = DelayedScalingState(recipe, E4M3), DelayedScalingState(recipe, E4M3)
            state.scale.fill_(s)
            ref_state.scale.fill_(s)
            q, qt = be.quantize_fp8_t(x, recipe, "input", state)
            rq, rqt = cast.quantize_fp8_t(x, recipe, "input", ref_state, backend="torch")
            assert_fp8(q, rq, f"scale {s} q")
            assert_fp8(qt, rqt, f"scale {s} q_t")
            assert_bits(state.amax_history, ref_state.amax_history, f"scale {s} amax history")
            assert_bits(state.scale, ref_state.scale, f"scale {s} state scale")
        check_fp8(x, Current(), "grad", transposed=True, be=be)
    casts = [s for s in seen if s[0] == "_cast_tensor_t_reg_kernel"]
    assert [s[1] for s in casts] == [(35,)] * 24, casts  # a program a 16x32 tile, 35 slots


_SASS_SCRIPT = textwrap.dedent("""
    import json, sys
    from benchmarks.quantize_sass import profile_rows
    print(json.dumps(profile_rows([sys.argv[1]], (16384, 4096), sys.argv[2:])))
""")


def test_sm90_rowwise_t_casts():
    """The rowwise cast with its transposed copy by the sweep kernels (rows past
    ``rowlocal_max_cols``) as launched for a 16384x4096 bf16 input on an H200 (compiled for
    sm_90): three launches, no spills; the amax pass loads 16 bytes a thread at a time with at
    most 16 SASS instructions an element in its loop; the cast loads 16 bytes a thread and stores
    16 bytes a thread in both copies."""
    new = run_script(_SASS_SCRIPT, "rowwise e4m3 +T", "rowlocal_max_cols=1024")
    assert [r["kernel"] for r in new] == ["_rowwise_t_amax2d_kernel", "_rowwise_t_scales_kernel",
                                          "_cast_rowwise_t_sweep_kernel"]
    cast = new[-1]
    assert cast["st_widths"] == [16] and 16 in cast["ld_widths"], cast
    assert all(r["stack"] == 0 for r in new), new
    assert new[0]["ld_widths"] == [16] and new[0]["per_elem"] <= 16, new[0]


def test_sm90_split_t_casts():
    """The split transposing casts (the defaults) as launched for a 16384x4096 bf16 input on an H200: x's copy by the row-local cast, the
    transposed copy by ``_cast_cols_t_kernel`` (after the column amax slots and scales for
    rowwise); the column kernel's tile in registers without spilling (at most 16 bytes of stack,
    at least 8 programs an SM) and 16-byte stores of the transposed codes."""
    block = run_script(_SASS_SCRIPT, "block 1x128 +T")
    rowwise = run_script(_SASS_SCRIPT, "rowwise e4m3 +T")
    assert [r["kernel"] for r in block] == ["_cast_rowblock_kernel", "_cast_cols_t_kernel"]
    assert [r["kernel"] for r in rowwise] == ["_rowwise_t_amax2d_kernel", "_rowwise_t_scales_kernel",
                                              "_cast_rowblock_kernel", "_cast_cols_t_kernel"]
    for cols in (block[-1], rowwise[-1]):
        assert cols["stack"] <= 16 and cols["resident"] >= 8 and 16 in cols["st_widths"], cols

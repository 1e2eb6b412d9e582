"""The sweep casts with a transposed copy (``lowbit.kernels.quantize_fp8_transpose_kernels``,
``quantize_fp8_rowwise_t_kernels``): 1x128 (and 1x32) blocks, 128x128 blocks and rowwise, each
with its transposed copy, bit-exact with the torch
reference on the Triton CPU interpreter: ragged shapes (rows / columns not multiples of the
tile), finite tiles (the fast encode) and tiles holding NaN, +-inf, zero blocks and subnormal
amax (the plain encode), bf16 / fp16 / fp32 inputs, E4M3 and E5M2; and the rowwise cast as
compiled for sm_90 (16-byte stores both ways, no spills, fewer instructions than the old kernel).
"""
import textwrap

import pytest
import torch

from lowbit.dtypes.formats import E4M3
from lowbit.kernels import cast
from lowbit.kernels import quantize as kq
from lowbit.scaling.delayed import DelayedScalingState
from lowbit.scaling.recipes import Blockwise, Current, Delayed, Rowwise
from sm90 import run_script
from test_quantize_kernels import assert_bits, assert_fp8, check_fp8, specials

RECIPES = {"block 1x128 e4m3": (Blockwise(), "input"), "block 1x128 grad e5m2": (Blockwise(grad_format="e5m2"), "grad"),
           "block 1x32": (Blockwise(act=(1, 32)), "input"), "rowwise e4m3": (Rowwise(), "input"),
           "rowwise grad e5m2": (Rowwise(), "grad")}


@pytest.fixture(params=["sweeps", "sweeps-prefetch", "split", "split-forward"])
def tiles(request, monkeypatch):
    """Both transposed casts on the sweep kernels (the 1xBC one with and without its prefetching
    second sweep), or split (``block_t_split`` / ``rowwise_t_split``: x's copy by the row-local
    cast, the transposed copy alone by ``_cast_cols_t_kernel``, walking last to first or first to
    last), whatever the defaults, at geometries that give several slices and programs. Returns
    the kernels that write the transposed copies, 1xBC then rowwise."""
    split = request.param.startswith("split")
    monkeypatch.setattr(kq.policy, "block_t_split", lambda: split)
    monkeypatch.setattr(kq.policy, "rowwise_t_split", lambda: split)
    monkeypatch.setattr(kq.policy, "block_t_tiles", lambda: True)
    monkeypatch.setattr(kq.policy, "rowwise_t_tiles", lambda: True)
    monkeypatch.setattr(kq.policy, "block_t_sweep_prefetch", lambda: request.param.endswith("prefetch"))
    monkeypatch.setattr(kq.policy, "block_t_sweep_rows", lambda: 16)  # several slices a tile at 1x32
    monkeypatch.setattr(kq.policy, "rowwise_t_amax_tile", lambda x: (32, 8, 32))  # several programs both ways
    monkeypatch.setattr(kq.policy, "rowwise_t_sweep_rows", lambda: (32, 8))
    monkeypatch.setattr(kq.policy, "cols_t_cols", lambda: 32)  # several programs a row of tiles
    monkeypatch.setattr(kq.policy, "cols_t_rows", lambda: 16)
    monkeypatch.setattr(kq.policy, "cols_t_reverse", lambda: request.param != "split-forward")
    if split:
        return "_cast_cols_t_kernel", "_cast_cols_t_kernel"
    return "_cast_1xn_t_sweep_kernel", "_cast_rowwise_t_sweep_kernel"


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


@pytest.mark.parametrize("name", list(RECIPES))
def test_tile_casts_bit_exact(name, tiles):
    recipe, role = RECIPES[name]
    cases = [((37, 300), torch.bfloat16), ((200, 130), torch.float32)]
    if name in ("block 1x128 e4m3", "rowwise e4m3"):
        cases += [((128, 256), torch.bfloat16), ((64, 96), torch.float16)]
    if recipe.format(role).name == "e4m3":
        x = _near_ties((64, 256), seed=30)
        check_fp8(x, recipe, role, transposed=True)
        check_fp8(x.t().contiguous(), recipe, role, transposed=True)
    for i, (shape, dtype) in enumerate(cases):
        check_fp8(_finite(shape, dtype, seed=i), recipe, role, transposed=True)
        check_fp8(_hard(shape, dtype, seed=10 + i), recipe, role, transposed=True)


def test_tile_casts_layouts_and_single_tiles(tiles):
    """A transposed (non-contiguous) input; tensors smaller than a tile and than a block."""
    base = _finite((300, 40), torch.bfloat16, seed=20)
    for recipe, role in (RECIPES["block 1x128 e4m3"], RECIPES["rowwise e4m3"]):
        check_fp8(base.t(), recipe, role, transposed=True)
        check_fp8(_hard((16, 48), torch.bfloat16, seed=21), recipe, role, transposed=True)
        check_fp8(torch.zeros(24, 128), recipe, role, transposed=True)


def test_tile_casts_are_the_launched_kernels(tiles, monkeypatch):
    """The tests above run the kernels ``tiles`` names for the transposed copies (not the old
    ones): a guard against testing the wrong path."""
    seen = []
    for mod, name in ((kq._k8x, "_cast_1xn_t_sweep_kernel"), (kq._k8r, "_cast_rowwise_t_sweep_kernel"),
                      (kq._k8c, "_cast_cols_t_kernel")):
        kernel = getattr(mod, name)

        class Spy:
            def __getitem__(self, grid, kernel=kernel, name=name):
                seen.append(name)
                return kernel[grid]
        monkeypatch.setattr(mod, name, Spy())
    x = _finite((40, 130), torch.bfloat16, seed=22)
    check_fp8(x, *RECIPES["block 1x128 e4m3"], transposed=True)
    check_fp8(x, *RECIPES["rowwise e4m3"], transposed=True)
    assert seen == list(tiles)


@pytest.mark.parametrize("one_read", [False, True], ids=["sweeps", "one-read"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_square_block_cast_bit_exact(dtype, one_read, monkeypatch):
    """128x128 blocks with the transposed copy by ``_cast_square_t_kernel`` (two sweeps) or
    ``_cast_square_t_reg_kernel`` (``square_t_one_read``: the block held in registers) (q's codes
    and scales transposed): ragged blocks both ways, finite and hard (NaN, inf, zero,
    subnormal-amax) blocks, a transposed input; the launch is that kernel's (a guard against
    testing another path)."""
    name = "_cast_square_t_reg_kernel" if one_read else "_cast_square_t_kernel"
    kernel, seen = getattr(kq._k8x, name), []

    class Spy:
        def __getitem__(self, grid):
            seen.append(grid)
            return kernel[grid]
    monkeypatch.setattr(kq._k8x, name, Spy())
    monkeypatch.setattr(kq.policy, "square_t_one_read", lambda: one_read)
    monkeypatch.setattr(kq.policy, "block_t_sweep_rows", lambda: 32)  # four slices a block
    recipe = Blockwise()
    check_fp8(_finite((300, 260), dtype, seed=40), recipe, "weight", transposed=True)
    check_fp8(_hard((130, 384), dtype, seed=41), recipe, "weight", transposed=True)
    check_fp8(_hard((260, 200), dtype, seed=42).t(), recipe, "weight", transposed=True)
    assert seen == [(9,), (6,), (6,)]


@pytest.mark.parametrize("one_read", [False, True], ids=["grid-stride", "one-read"])
def test_tensorwise_t_casts_bit_exact(one_read, monkeypatch):
    """Tensorwise casts with the transposed copy by ``_cast_tensor_t_reg_kernel``
    (``transpose_one_read``; 16x32 tiles: many programs, ragged tiles) or ``_cast_tensor_kernel``:
    delayed scaling with state scales whose quotients overflow past the one-read kernel's 2^99
    guard of its finite encode (1e-30, the smallest subnormal), saturate, or are 0 / inf / NaN,
    on finite tiles and tiles holding NaN / inf; the state after each step (the amax slots reduced
    16 at a time); current scaling; the launch is the chosen kernel's."""
    name = "_cast_tensor_t_reg_kernel" if one_read else "_cast_tensor_kernel"
    kernel, seen = getattr(kq._k8x if one_read else kq._k8t, name), []

    class Spy:
        def __getitem__(self, grid):
            seen.append(grid)
            return kernel[grid]
    monkeypatch.setattr(kq._k8x if one_read else kq._k8t, name, Spy())
    monkeypatch.setattr(kq, "_interpreted", lambda: True)  # it looks at _cast_tensor_kernel's type
    monkeypatch.setattr(kq.policy, "transpose_one_read", lambda: one_read)
    monkeypatch.setattr(kq.policy, "transpose_one_read_tile", lambda: (16, 32))
    monkeypatch.setattr(kq.policy, "amax_reduce_block", lambda: 16)
    finite, hard = _finite((70, 200), torch.bfloat16, seed=50), _hard((70, 200), torch.bfloat16, seed=51)
    for x in (finite, hard, finite.float() * 2.0 ** 90):
        for s in (7.0, 1e-30, 2.0 ** -149, 3.4e38, 0.0, float("inf"), float("nan")):
            recipe = Delayed(history_len=2)
            state, ref_state = DelayedScalingState(recipe, E4M3), DelayedScalingState(recipe, E4M3)
            state.scale.fill_(s)
            ref_state.scale.fill_(s)
            q, qt = kq.quantize_fp8_t_triton(x, recipe, "input", state)
            rq, rqt = cast.quantize_fp8_t(x, recipe, "input", ref_state, backend="torch")
            assert_fp8(q, rq, f"scale {s} q")
            assert_fp8(qt, rqt, f"scale {s} q_t")
            assert_bits(state.amax_history, ref_state.amax_history, f"scale {s} amax history")
            assert_bits(state.scale, ref_state.scale, f"scale {s} state scale")
        check_fp8(x, Current(), "grad", transposed=True)
    assert seen == [(35,) if one_read else (3,)] * 24, seen  # one-read: a program a 16x32 tile, 35 slots


_SASS_SCRIPT = textwrap.dedent("""
    import json, sys
    from benchmarks.quantize_sass import profile_rows
    print(json.dumps(profile_rows([sys.argv[1]], (16384, 4096), sys.argv[2:])))
""")


def test_sm90_rowwise_t_casts():
    """The rowwise cast with its transposed copy by the sweep kernels (``rowwise_t_split`` off) as
    launched for a 16384x4096 bf16 input on an H200 (compiled for sm_90): three launches, no
    spills; the amax pass loads 16 bytes a thread at a time with at most 16 SASS instructions an
    element in its loop; the cast loads 16 bytes a thread and stores 16 bytes a thread in both
    copies, in fewer instructions an element in its loop (both encode paths counted) than session
    3's one-tile kernel on its common path (92.9)."""
    new = run_script(_SASS_SCRIPT, "rowwise e4m3 +T", "rowwise_t_tiles=True", "rowwise_t_split=False")
    old = [r for r in run_script(_SASS_SCRIPT, "rowwise e4m3 +T", "rowwise_t_tiles=False", "rowwise_t_split=False")
           if r["kernel"] == "_cast_rowwise_kernel"]
    assert [r["kernel"] for r in new] == ["_rowwise_t_amax2d_kernel", "_rowwise_t_scales_kernel",
                                          "_cast_rowwise_t_sweep_kernel"]
    cast = new[-1]
    assert cast["st_widths"] == [16] and 16 in cast["ld_widths"], cast
    assert all(r["stack"] == 0 for r in new), new
    assert cast["per_elem"] < old[0]["path_per_elem"], (cast, old)
    assert new[0]["ld_widths"] == [16] and new[0]["per_elem"] <= 16, new[0]


def test_sm90_split_t_casts():
    """The split transposing casts (``block_t_split``, ``rowwise_t_split``, the defaults) as
    launched for a 16384x4096 bf16 input on an H200: x's copy by the row-local cast, the
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

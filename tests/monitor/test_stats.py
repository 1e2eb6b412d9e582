"""The statistics of one record: the torch reduction against element-wise definitions (the flush
count is what lowbit's reference quantize rounds to 0), and the Triton kernel (interpreted on the
CPU) against the torch reduction, figure for figure, in every dtype and a permuted layout."""
import numpy as np
import pytest
import torch

from lowbit.dtypes.formats import get_format
from lowbit.fma_guard.compile import compile_kernel  # before any interpreted kernel runs (it checks)
from lowbit.dtypes.quantize import quantize
from lowbit.monitor.stats import COL, cast_scale, reduce_into, reset_template
from lowbit.scaling import MX, NV, Blockwise, Delayed, Rowwise


def _sample(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 160, generator=g) * torch.logspace(-7, 3, 160)
    x[0, 3], x[1, 7], x[2, 9] = float("nan"), float("inf"), float("-inf")
    x[3, :20] = 0.0
    return x.to(dtype)


@pytest.mark.parametrize("fmt,s", [("e4m3", 0.37), ("e5m2", 0.01), ("e2m1", 0.37)])
def test_reference_counts_match_the_elementwise_definitions(fmt, s):
    f = get_format(fmt)
    x = _sample(torch.float32)
    scale = torch.tensor(s)
    buf = reset_template(1, "cpu")
    reduce_into(buf, 0, x, scale, f, kernel=False)
    row = buf[0]
    fin = torch.isfinite(x)
    q = quantize(torch.nan_to_num(x, nan=1.0, posinf=1.0, neginf=1.0), f, scale)
    flushed = (x != 0) & fin & ((q.float() == 0) if fmt != "e2m1" else ((q & 7) == 0))
    assert row[COL["nonfinite"]] == 3 and row[COL["numel"]] == x.numel() and row[COL["calls"]] == 1
    assert row[COL["amax"]] == x[fin].abs().max().double()
    assert row[COL["underflow"]] == flushed.sum()  # what the reference cast turns into 0
    if fmt != "e2m1":  # saturated: what the cast without saturation would send out of range (+-inf too)
        over = ~torch.isfinite(quantize(torch.nan_to_num(x, nan=0.0), f, scale, saturate=False).float())
        assert row[COL["saturated"]] == over.sum() and over.sum() > torch.isinf(x).sum()
    else:
        assert row[COL["saturated"]] == ((x.abs() / scale >= 7.0) & ~torch.isnan(x)).sum()  # 7 rounds up to 8
    assert row[COL["nonzero"]] == (x != 0).sum()
    assert row[COL["seq"]] == 0 and buf[-1, 0] == 1  # one non-finite record took ticket 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_triton_kernel_matches_the_torch_reduction(dtype, monkeypatch):
    from lowbit.monitor.stats_kernel import launch
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read at launch: the kernel runs interpreted
    f = get_format("e4m3")
    x = _sample(dtype)
    scale = torch.tensor(0.02)
    ref, got = reset_template(3, "cpu"), reset_template(3, "cpu")
    reduce_into(ref, 0, x, scale, f, kernel=False)
    reduce_into(ref, 1, x[1:4])  # no cast: counts and amax only
    reduce_into(ref, 2, x)
    assert launch(got, 0, x.t(), scale, f)  # a permuted (dense, not contiguous) layout
    assert launch(got, 1, x[1:4], None, None)
    assert launch(got, 2, x, None, None)
    same = [c for n, c in COL.items() if n != "seq"]
    torch.testing.assert_close(got[:3, same], ref[:3, same], rtol=0, atol=0)
    # tickets: every record saw a non-finite value; each kernel's tickets exceed the previous one's
    assert got[0, COL["seq"]] < got[1, COL["seq"]] < got[2, COL["seq"]] < got[-1, 0]
    assert not launch(got, 0, x[:, ::2], None, None)  # strided: not dense, left to torch ops


def test_cast_scale_is_the_layers_own_scale():
    x = _sample(torch.float32)[:, :128].nan_to_num(0.0, 0.0, 0.0)
    buf = torch.full((), 0.5)
    s, f = cast_scale(x, Delayed(), "input", buf, prime=False)
    assert s == 0.5 and buf == 0.5 and f.name == "e4m3"  # the delayed state's scale, not modified
    s, _ = cast_scale(x, Delayed(), "grad", buf, prime=True)  # cold start: the tensor's own amax
    assert s == torch.tensor(x.abs().max().item() / 57344.0) and buf == 0.5
    s, f = cast_scale(x, Rowwise(), "input", None, prime=False)  # one scale per row
    assert torch.equal(s[:, 0], x.abs().amax(1) / 448.0) and s.shape == x.shape


_STATS_SIG = {"x_ptr": "*bf16", "n": "i32", "stats_ptr": "*fp64", "slot": "i32", "clock": "i32", "scale_ptr": "*fp32",
              "when": "i32", "limit": "fp32", "tiny": "fp32", "fmax": "fp32"}


@pytest.mark.parametrize("has_scale", [False, True])
def test_triton_kernel_compiles_for_sm90_with_vector_loads(has_scale):
    """Built for an H100/H200 (no GPU needed): bf16 read 16 bytes a load; the IEEE-rounded
    quotients are the thresholds' bisections only, none an element (as many with twice the
    elements a thread), and no comparison flushes subnormals."""
    from lowbit.monitor.stats_kernel import BLOCK, _stats_kernel
    sig = _STATS_SIG
    cx = dict(HAS_SCALE=has_scale, HAS_WHEN=has_scale, SQNR=False, MBITS=3, EMIN=-6, BLOCK=BLOCK)
    div16 = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 5)}  # what a launch specializes: pointers, n
    ptx = compile_kernel(_stats_kernel, sig, cx, num_warps=8, attrs=div16).ptx
    wide = compile_kernel(_stats_kernel, sig, {**cx, "BLOCK": 2 * BLOCK}, num_warps=8, attrs=div16).ptx
    assert "ld.global.v4.b32" in ptx and "ld.global.b16" not in ptx
    divs = ptx.count("div.rn.f32")
    assert (divs > 0) == has_scale and wide.count("div.rn.f32") == divs and ".ftz" not in ptx
    assert ".add.f64" in ptx  # float64 atomics into the row


@pytest.mark.parametrize("has_scale,has_when,sqnr", [(False, False, False), (False, True, False), (True, False, False),
                                                     (True, False, True)])
def test_triton_kernel_compiles_for_a_one_element_tensor(has_scale, has_when, sqnr):
    """A launch on a 1-element tensor (a loss, a scalar parameter) specializes ``n`` to the
    constexpr 1: the kernel must build that way too, for sm_90, every flag combination, unaligned
    (the rows are never specialized); SQNR steps' sums are float64 atomics, no subnormal flushed."""
    from lowbit.monitor.stats_kernel import BLOCK, _stats_kernel
    cx = dict(n=1, HAS_SCALE=has_scale, HAS_WHEN=has_when, SQNR=sqnr, MBITS=2, EMIN=-14, BLOCK=BLOCK)
    ptx = compile_kernel(_stats_kernel, {**_STATS_SIG, "n": "constexpr"}, cx, num_warps=8).ptx
    # nonfinite, clock ticket, numel, calls; saturated, underflow, nonzero; signal, noise
    assert ptx.count(".add.f64") == 4 + (3 if has_scale else 0) + (2 if sqnr else 0) and ".ftz" not in ptx


def _around(v: float, n: int = 12) -> np.ndarray:
    """fp32 values from n ulps below ``v`` (as fp32) to n ulps above, both signs."""
    c = np.float32(v)
    lo, hi = [c], [c]
    for _ in range(n):
        lo.append(np.nextafter(lo[-1], np.float32(0)))
        hi.append(np.nextafter(hi[-1], np.float32(np.inf)))
    vals = np.array(lo[::-1] + hi[1:], dtype=np.float32)
    return np.concatenate([vals, -vals])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # 0 / 0 and inf / inf in the interpreter
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1"])
@pytest.mark.parametrize("s", [0.37, 2.0 ** -20, 1.1754944e-38, 3.3e-42, 7.3e30, 1.0, -0.021, 0.0, float("inf"),
                               float("nan")])
def test_triton_thresholds_count_what_the_division_counts(fmt, s, monkeypatch):
    """The kernel compares |x| with thresholds found once (no division per element): at every fp32
    value within 12 ulps of ``limit * s`` and of ``tiny * s`` (both signs), and at 0, +-inf and
    NaN, for normal, subnormal, huge, negative, zero, infinite and NaN scales, its saturated,
    underflow and non-zero counts are those of the IEEE quotient."""
    from lowbit.monitor.stats import saturation_limit
    from lowbit.monitor.stats_kernel import launch
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    f = get_format(fmt)
    with np.errstate(over="ignore", invalid="ignore"):
        edges = [saturation_limit(f) * abs(s), f.min_subnormal / 2 * abs(s)]
        vals = [_around(e) for e in edges if np.isfinite(np.float32(e))]
    x = torch.from_numpy(np.concatenate(vals + [np.array([0.0, np.inf, -np.inf, np.nan], np.float32)]))
    scale = torch.tensor(s, dtype=torch.float32)
    ref, got = reset_template(1, "cpu"), reset_template(1, "cpu")
    reduce_into(ref, 0, x, scale, f, kernel=False)
    assert launch(got, 0, x, scale, f)
    for c in ("saturated", "underflow", "nonzero"):
        assert got[0, COL[c]] == ref[0, COL[c]], c
    if np.isfinite(s) and s != 0:  # the sweep straddles the edges it can reach: the counts are not trivial
        assert 0 < ref[0, COL["saturated"]] < x.numel()
        if np.float32(edges[1]) >= 2.0 ** -126:  # (a flush edge below the normal range is all or nothing)
            assert 0 < ref[0, COL["underflow"]] < x.numel()


def _wide_sample(dtype, seed=1):
    """(48, 320): ragged against 128-element and 128-row blocks; NaN, +-inf, zeros, and values
    spanning 1e-7..1e3 inside blocks (so block casts flush some)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(48, 320, generator=g) * torch.logspace(-7, 3, 320)[torch.randperm(320, generator=g)]
    x[0, 3], x[1, 7], x[40, 300] = float("nan"), float("inf"), float("-inf")
    x[3, :40] = 0.0
    return x.to(dtype)


@pytest.mark.parametrize("recipe,role", [(Rowwise(), "input"), (Blockwise(), "input"), (Blockwise(), "weight"),
                                         (MX(), "grad"), (NV(), "input"), (NV(), "weight")],
                         ids=["rowwise", "1x128", "128x128", "mx", "nv", "nv-weight"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_block_kernel_matches_the_torch_reduction(recipe, role, dtype, monkeypatch):
    """Block-scaled casts (a scale per row, 1x128, 128x128, MX's 32, NV's 16 and 16x16): the
    Triton kernel's figures are the torch reduction's over the expanded scales, figure for figure."""
    from lowbit.monitor.stats import block_scale
    from lowbit.monitor.stats_kernel import launch_blocks
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    x = _wide_sample(dtype)
    scales, block, f = block_scale(x, recipe, role, None, False)
    assert not block.is_tensorwise
    ref, got = reset_template(1, "cpu"), reset_template(1, "cpu")
    reduce_into(ref, 0, x, scales, f, kernel=False, block=block)
    assert launch_blocks(got, 0, x, scales, block, f)
    same = [c for n, c in COL.items() if n != "seq"]
    torch.testing.assert_close(got[0, same], ref[0, same], rtol=0, atol=0, equal_nan=True)
    assert ref[0, COL["underflow"]] > 0 and ref[0, COL["saturated"]] > 0 and ref[0, COL["nonfinite"]] == 3
    assert got[0, COL["seq"]] == 0  # the record saw a non-finite value: the first ticket
    assert not launch_blocks(got, 0, x[:, ::2], scales, block, f)  # columns not adjacent: left to torch ops


@pytest.mark.parametrize("recipe,role", [(Rowwise(), "input"), (Blockwise(), "input"), (Blockwise(), "weight"),
                                         (NV(), "input")], ids=["rowwise", "1x128", "128x128", "nv"])
def test_triton_block_kernel_flush_count_at_the_edges(recipe, role, monkeypatch):
    """The small elements moved to within about 8 ulps of their block's flush edge
    ``tiny * scale`` (the block amaxes, so the scales, unchanged): the kernel's flush count is the
    IEEE quotient's, where a product with the rounded reciprocal would count some differently."""
    from lowbit.monitor.stats import block_scale
    from lowbit.monitor.stats_kernel import launch_blocks
    from lowbit.scaling.blocks import expand_scale
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    x = _wide_sample(torch.float32).nan_to_num(0.0, 0.0, 0.0)
    scales, block, f = block_scale(x, recipe, role, None, False)
    s_elem = expand_scale(scales, x.shape, block).to(torch.float32)
    g = torch.Generator().manual_seed(3)
    edge = s_elem * (f.min_subnormal / 2) * (1 + (torch.rand(x.shape, generator=g) - 0.5) * 2e-6)
    x = torch.where(x.abs() < s_elem, edge, x)  # far below a block's amax (about fmax * scale)
    again, _, _ = block_scale(x, recipe, role, None, False)
    assert torch.equal(again, scales)
    ref, got = reset_template(1, "cpu"), reset_template(1, "cpu")
    reduce_into(ref, 0, x, scales, f, kernel=False, block=block)
    assert launch_blocks(got, 0, x, scales, block, f)
    assert got[0, COL["underflow"]] == ref[0, COL["underflow"]] > 1000


_BLOCK_SIG = {"x_ptr": "*bf16", "M": "i32", "K": "i32", "stride_m": "i32", "s_ptr": "*fp32", "stride_sm": "i32",
              "stats_ptr": "*fp64", "slot": "i32", "clock": "i32", "limit": "fp32", "tiny": "fp32", "fmax": "fp32"}


@pytest.mark.parametrize("block", [(1, 128), (128, 128), (1, 32), (1, None)], ids=["1x128", "128x128", "mx", "row"])
def test_triton_block_kernel_compiles_for_sm90_with_vector_loads(block):
    """Built for an H100/H200 (no GPU needed): bf16 rows read 16 bytes a load, one IEEE-rounded
    quotient an element (SQNR steps' cast reuses it), no comparison flushing subnormals."""
    from lowbit.monitor.stats_kernel import TILE, WHOLE, _block_stats_kernel
    aligned = {(i,): [["tt.divisibility", 16]] for i in (0, 2, 3, 4, 5, 6)}  # pointers, K, strides
    per_thread = TILE[0] * TILE[1] // (8 * 32)
    for sqnr in (False, True):
        cx = dict(SQNR=sqnr, MBITS=3, EMIN=-6, BR=block[0], BC=block[1] or WHOLE, TM=TILE[0], TK=TILE[1])
        ptx = compile_kernel(_block_stats_kernel, _BLOCK_SIG, cx, num_warps=8, attrs=aligned).ptx
        assert "ld.global.v4.b32" in ptx and "ld.global.b16" not in ptx
        assert ptx.count("div.rn.f32") == per_thread and ".ftz" not in ptx


@pytest.mark.parametrize("dim", ["M", "K"])
def test_triton_block_kernel_compiles_for_one_row_or_one_column(dim):
    """A one-token (or one-column) matrix makes that size a constexpr 1 at launch: the block
    kernel must build that way too (for sm_90)."""
    from lowbit.monitor.stats_kernel import TILE, WHOLE, _block_stats_kernel
    sig = {**_BLOCK_SIG, dim: "constexpr"}
    cx = {dim: 1, "SQNR": False, "MBITS": 3, "EMIN": -6, "BR": 1, "BC": WHOLE, "TM": TILE[0], "TK": TILE[1]}
    ptx = compile_kernel(_block_stats_kernel, sig, cx, num_warps=8).ptx
    assert ".add.f64" in ptx


_NOT_SQNR = [c for n, c in COL.items() if n not in ("seq", "signal", "noise")]


def _assert_sqnr_close(got, ref):
    """Every figure the torch reduction's exactly; the float64 sums of squares to 1e-12 (their
    order differs) and not trivial."""
    torch.testing.assert_close(got[0, _NOT_SQNR], ref[0, _NOT_SQNR], rtol=0, atol=0, equal_nan=True)
    for c in ("signal", "noise"):
        assert ref[0, COL[c]] > 0
        torch.testing.assert_close(got[0, COL[c]], ref[0, COL[c]], rtol=1e-12, atol=0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # x / 0 in the interpreter
@pytest.mark.parametrize("fmt,s", [("e4m3", 0.02), ("e4m3", 3.3e-42), ("e5m2", 0.01), ("e5m2", 7.3e30),
                                   ("e2m1", 0.37), ("e4m3", 0.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_sqnr_matches_the_torch_reduction(fmt, s, dtype, monkeypatch):
    """SQNR steps in the kernel's one pass: the cast's signal and noise (round to nearest even on
    the format's grid, saturated, dequantized in fp32) are the reference quantize's, at scales
    that saturate, flush, make subnormal quotients, or are 0 (every quotient infinite)."""
    from lowbit.monitor.stats_kernel import launch
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    f = get_format(fmt)
    x = _sample(dtype)
    scale = torch.tensor(s)
    ref, got = reset_template(1, "cpu"), reset_template(1, "cpu")
    reduce_into(ref, 0, x, scale, f, sqnr=True, kernel=False)
    assert launch(got, 0, x, scale, f, sqnr=True)
    _assert_sqnr_close(got, ref)


@pytest.mark.parametrize("recipe,role", [(Rowwise(), "input"), (Blockwise(), "weight"), (MX(), "grad"), (NV(), "input")],
                         ids=["rowwise", "128x128", "mx", "nv"])
def test_triton_block_sqnr_matches_the_torch_reduction(recipe, role, monkeypatch):
    """SQNR of block-scaled casts (FP8 and FP4 grids) in the block kernel's one pass: the torch
    reduction's over the expanded scales."""
    from lowbit.monitor.stats import block_scale
    from lowbit.monitor.stats_kernel import launch_blocks
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    x = _wide_sample(torch.bfloat16)
    scales, block, f = block_scale(x, recipe, role, None, False)
    ref, got = reset_template(1, "cpu"), reset_template(1, "cpu")
    reduce_into(ref, 0, x, scales, f, sqnr=True, kernel=False, block=block)
    assert launch_blocks(got, 0, x, scales, block, f, sqnr=True)
    _assert_sqnr_close(got, ref)


def test_launch_plans_are_reused_and_keyed_by_alignment(monkeypatch):
    """A monitor's launches are made once per specialization: the same key reuses its plan, a
    tensor 2 bytes off the 16-byte alignment (a view) gets its own, and both give the figures of
    the torch reduction."""
    from lowbit.monitor.stats_kernel import launch
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    f, scale = get_format("e4m3"), torch.tensor(0.02)
    x = _sample(torch.bfloat16)
    plans: dict = {}
    ref, got = reset_template(2, "cpu"), reset_template(2, "cpu")
    for _ in range(2):
        assert launch(got, 0, x, scale, f, plans=plans)
        reduce_into(ref, 0, x, scale, f, kernel=False)
    assert len(plans) == 1
    view = x.reshape(-1)[1:161]
    assert view.data_ptr() % 16 != 0
    assert launch(got, 1, view, scale, f, plans=plans)
    reduce_into(ref, 1, view, scale, f, kernel=False)
    assert len(plans) == 2
    torch.testing.assert_close(got[:2, _NOT_SQNR], ref[:2, _NOT_SQNR], rtol=0, atol=0)

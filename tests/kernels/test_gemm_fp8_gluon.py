"""CPU checks of the warp-specialized Gluon FP8 GEMM (lowbit/kernels/triton/gemm_fp8/gluon_ws.py): it compiles
for sm_90a under the installed triton into three partitions with their own register budgets, the
consumers' schedule survives to SASS (async wgmma, ``wait_group 1`` between the two ops of a stage,
no serialization, no spills where promoting), every consumer synchronizes only its own warp group
(128-thread named barriers, never the CTA) and the launch configurations fit the SM. The numbers
are checked on the GPU by ``benchmarks/gemm.py`` and ``benchmarks/gemm_ab.py``."""
import re
import subprocess
import textwrap

import pytest
import torch

from lowbit.dtypes import FP8Tensor
from lowbit.kernels.triton import TRITON_BACKEND, make_backend
from lowbit.kernels.triton.gemm_fp8 import GEMM_FP8_TUNING, WS_CONFIGS
from lowbit.kernels.triton.gemm_fp8 import gluon_ws as ws
from lowbit.kernels.triton.gemm_fp8 import launch as gemm
from lowbit.scaling import MX, Blockwise, Current, Rowwise
from sm90 import run_script

pytestmark = pytest.mark.skipif(ws.gluon_available() is not None, reason=f"no Gluon: {ws.gluon_available()}")

SMEM_LIMIT = 227 * 1024  # sm_90 per-block opt-in maximum
REGS_PER_SM = 65536

_COMPILE = textwrap.dedent("""
    import json, sys
    from lowbit.kernels.triton.gemm_fp8 import gluon_ws as ws
    k = ws.compile_ws_for_sm90(sys.argv[1], sys.argv[2], a_type=sys.argv[3], b_type=sys.argv[4])
    print(json.dumps({"ptx": k.asm["ptx"], "shared": k.metadata.shared}))
""")


def _tools():
    import os
    import triton.backends.nvidia as nv
    from triton.backends.nvidia.compiler import get_ptxas
    return get_ptxas(90).path, os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump")


@pytest.fixture(scope="module", params=[("tensorwise", "ws_s3"), ("rowwise", "ws_s3"), ("blockwise", "ws_s3_ss"),
                                        ("blockwise_cols", "ws_s3_ss"), ("tensorwise", "ws_s3_g16_eo"),
                                        ("rowwise", "ws_s3_g16_eo"), ("blockwise_cols", "ws_s3_g16_ss"),
                                        ("blockwise", "ws_s3_g16_ss_eo")],
                ids=lambda p: "-".join(p))
def compiled(request, tmp_path_factory):
    """(mode, config, PTX, ptxas -v stderr, SASS, shared bytes)."""
    mode, cfg = request.param
    k = run_script(_COMPILE, mode, cfg, "fp8e4nv", "fp8e4nv")
    d = tmp_path_factory.mktemp(f"{mode}_{cfg}")
    (d / "k.ptx").write_text(k["ptx"])
    ptxas, cuobjdump = _tools()
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(d / "k.ptx"), "-o", str(d / "k.cubin")],
                       capture_output=True, text=True, check=True)
    sass = subprocess.run([cuobjdump, "-sass", str(d / "k.cubin")], capture_output=True, text=True,
                          check=True).stdout
    return mode, cfg, k["ptx"], r.stderr, sass, k["shared"]


def test_three_partitions_with_their_register_budgets(compiled):
    _, cfg, ptx, *_ = compiled
    c = WS_CONFIGS[cfg]
    counts = {int(n) for n in re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx)}
    assert c.consumer_regs in counts and c.producer_regs in counts, counts
    assert f".maxnreg {c.maxnreg}" in ptx


def test_consumers_sync_only_their_warp_group(compiled):
    ptx = compiled[2]
    arrives = len(re.findall(r"mbarrier\.arrive\.shared::cta\.b64", ptx))
    assert arrives >= 2  # each consumer releases its slots
    # the partition barrier before each arrive spans one warp group, never the whole CTA
    named = re.findall(r"bar\.sync\s+(\d+),\s*(\d+);", ptx)
    assert named and all(n == "128" for _, n in named), named
    assert "mbarrier.arrive.expect_tx" in ptx  # the producer's TMA transaction count


def test_sass_keeps_the_schedule(compiled):
    mode, cfg, _, log, sass, _ = compiled
    for code in ("C7510", "C7514", "C7515", "C7517"):  # serialized / injected-wait diagnostics
        assert code not in log, log
    bn = WS_CONFIGS[cfg].block_n
    assert f"QGMMA.64x{bn}x32.F32.E4M3.E4M3" in sass
    # promoting (blockwise_cols too): both consumers overlap the promotion of one op with the other op's wgmma
    assert sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") >= 2
    if cfg.endswith("_eo"):  # the overlapped epilogue: a few spilled registers with triton 3.9 (68 B for
        spill = re.search(r"(\d+) bytes spill stores", log)  # tensorwise), none with 3.6 (the H200's)
        assert spill and int(spill.group(1)) <= 128, log
    elif mode != "rowwise":  # rowwise's epilogue spills a few registers (its 2 x 64 scale loads)
        assert "0 bytes spill stores, 0 bytes spill loads" in log, log


def test_shared_memory_fits(compiled):
    assert 0 < compiled[5] <= SMEM_LIMIT


def _k_loops(sass):
    """The instruction lists of the SASS loops that issue wgmmas (backward branches)."""
    ins = [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    at = {a: i for i, (a, _) in enumerate(ins)}
    loops = []
    for i, (a, t) in enumerate(ins):
        m = re.search(r"BRA (0x[0-9a-f]+)", t)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in at:
            body = [x for _, x in ins[at[int(m.group(1), 16)]:i + 1]]
            if any("GMMA" in x for x in body) and len(body) < 600:  # a K loop, not a tile loop
                loops.append(body)
    return loops


def test_scale_ring_keeps_global_loads_out_of_the_k_loop(compiled):
    """With the scale ring (``_ss``) the consumers' K loops read the chunk scales from shared memory:
    no global load in them but blockwise's one sB scalar a chunk, and no warp-group barrier for
    blockwise_cols' layout change (without the ring: 6 global loads a stage, and 3 more barriers
    for blockwise_cols)."""
    mode, cfg, _, _, sass, _ = compiled
    loops = _k_loops(sass)
    assert len(loops) >= 2, len(loops)  # one a consumer warp group
    for body in loops:
        ldg = sum(bool(re.search(r"\bLDG\b", x)) for x in body)
        bars = sum("BAR.SYNC" in x for x in body)
        if mode.startswith("blockwise"):
            assert WS_CONFIGS[cfg].smem_scales
            assert ldg <= (2 if mode == "blockwise" else 0), (ldg, cfg)
            assert any(re.search(r"\bLDS\b", x) for x in body)
            assert bars <= 2, bars


def test_scale_rows_for_tma():
    """``chunk_rows``: unit column stride, row stride a multiple of 4 elements, 16-byte base, the
    same values; no copy when the scales already are so."""
    g = torch.Generator().manual_seed(5)
    for chunks, n in ((3, 8), (5, 1030), (9, 1001), (1, 1)):
        s = torch.rand(n, chunks, generator=g).t()  # (chunks, n) column-major, as sA.t() arrives
        r = ws.chunk_rows(s)
        assert torch.equal(r, s) and r.stride(1) == 1 and r.stride(0) % 4 == 0 and r.stride(0) >= n
        assert r.data_ptr() % 16 == 0
        assert ws.chunk_rows(r) is r
    c = torch.rand(4, 1024, generator=g)
    assert ws.chunk_rows(c) is c


def test_configs_fit_an_sm():
    for name, c in WS_CONFIGS.items():
        ring = 2 * c.stages * c.subk * (128 + 128) * 4 if c.smem_scales else 0  # sA and sB rows a chunk
        assert (c.stages * c.subk * (128 * 128 + c.block_n * 128)) + ring <= SMEM_LIMIT - 1024, name
        assert c.subk == 2 and c.block_n == 128, name
        assert c.maxnreg * 12 * 32 <= REGS_PER_SM, name  # 3 warp groups (the producer's warp rounds up)
        default_regs = 3 * c.maxnreg - c.consumer_regs - c.producer_regs  # what the default consumer is left
        assert all(r % 8 == 0 and 24 <= r <= 256 for r in (c.consumer_regs, c.producer_regs, default_regs)), name
        assert default_regs >= c.consumer_regs, name  # both consumers hold the same accumulators


def _operands(recipe, seed=3, M=64):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(M, 384, generator=g), torch.randn(256, 384, generator=g)
    return FP8Tensor.from_float(x, recipe, "input"), FP8Tensor.from_float(w, recipe, "weight").t()


def test_kernel_ws_falls_back_exactly_on_the_cpu():
    """Where the Gluon kernel declines (CPU, interpreter), ``kernel="ws"`` is the plain-Triton GEMM."""
    ws_be = make_backend(gemm_fp8_tuning=GEMM_FP8_TUNING.override(kernel="ws"))
    for recipe, fast in ((Current(), False), (Current(), True), (Blockwise(), False)):
        a, b = _operands(recipe)
        got = ws_be.scaled_mm(a, b, torch.float32, None, fast_accum=fast)
        want = TRITON_BACKEND.scaled_mm(a, b, torch.float32, None, fast_accum=fast)
        assert torch.equal(got, want)


def test_ws_modes_and_declines():
    """The recipes' scale layouts map to the kernel's modes (wgrad's operands, both 1x128 along the
    tokens: blockwise_cols; MX: none); on the CPU ``ws_support`` declines, never raises."""
    for recipe, mode in ((Current(), "tensorwise"), (Rowwise(), "rowwise"), (Blockwise(), "blockwise"),
                         (MX(), None)):
        a, b = _operands(recipe)
        assert gemm._ws_mode(gemm.scale_geometry(a, b)) == mode
        assert "CUDA" in ws.ws_support(a._data, b._data, mode or "tensorwise", torch.bfloat16, None)
    a = FP8Tensor.from_float(torch.randn(64, 256), Blockwise(), "input")
    b = FP8Tensor.from_float(torch.randn(256, 256), Blockwise(), "input").t()
    assert gemm._ws_mode(gemm.scale_geometry(a, b)) == "blockwise_cols"
    assert "FP8" in ws.ws_support(a._data.float(), b._data, "tensorwise", torch.bfloat16, None)


def test_k_scaled_gemms_ignore_fast_accum():
    """A blockwise (K-scaled) GEMM is promoted every chunk either way: the same bits with and
    without fast_accum, on every path the CPU runs."""
    for recipe in (Blockwise(), MX()):
        a, b = _operands(recipe, seed=4)
        for kernel in ("auto", "tma", "pointer"):
            be = make_backend(gemm_fp8_tuning=GEMM_FP8_TUNING.override(kernel=kernel))
            assert torch.equal(be.scaled_mm(a, b, torch.float32, None, fast_accum=True),
                               be.scaled_mm(a, b, torch.float32, None, fast_accum=False)), kernel


def test_ws_configuration_by_size_and_mode():
    """GROUP_M 16 and the overlapped epilogue for large tensorwise / rowwise outputs, with or
    without a bias; the scale ring for the blockwise modes at every size; small GEMMs keep the
    configurations without the overlap. Promoting GEMMs of >= 128 rows are the kernel's."""
    t = GEMM_FP8_TUNING
    assert t.ws_config(8192, 8192, "tensorwise") == t.ws_config(16384, 14336, "rowwise") == WS_CONFIGS["ws_s3_g16_eo"]
    assert t.ws_config(8200, 8320, "tensorwise") == WS_CONFIGS["ws_s3_g16_eo"]
    assert t.ws_config(4096, 4096, "tensorwise") == WS_CONFIGS["ws_s3"]
    assert t.ws_config(8192, 8192, "blockwise") == WS_CONFIGS["ws_s3_g16_ss_eo"]
    assert t.ws_config(8192, 8192, "blockwise_cols") == WS_CONFIGS["ws_s3_g16_ss"]
    assert t.ws_config(4096, 4096, "blockwise") == t.ws_config(14336, 4096, "blockwise_cols") == WS_CONFIGS["ws_s3_ss"]
    assert WS_CONFIGS["ws_s3_g16_eo"].epi_overlap and t.gluon_min_m == 128

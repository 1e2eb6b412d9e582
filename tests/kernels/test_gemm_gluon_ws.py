"""CPU checks of the warp-specialized Gluon FP8 GEMM (lowbit/kernels/gemm_gluon_ws.py): it compiles
for sm_90a under the installed triton into three partitions with their own register budgets, the
consumers' schedule survives to SASS (async wgmma, ``wait_group 1`` between the two ops of a stage,
no serialization, no spills where promoting), every consumer synchronizes only its own warp group
(128-thread named barriers, never the CTA) and the launch configurations fit the SM. The numbers
are checked on the GPU by ``benchmarks/gemm_gluon.py`` (``--configs ws_s3,...``)."""
import re
import subprocess
import textwrap

import pytest
import torch

from lowbit.kernels import gemm_gluon as gg
from lowbit.kernels import gemm_gluon_ws as ws
from sm90 import run_script

pytestmark = pytest.mark.skipif(gg.gluon_available() is not None, reason=f"no Gluon: {gg.gluon_available()}")

SMEM_LIMIT = 227 * 1024  # sm_90 per-block opt-in maximum
REGS_PER_SM = 65536

_COMPILE = textwrap.dedent("""
    import json, sys
    from lowbit.kernels import gemm_gluon_ws as ws
    k = ws.compile_ws_for_sm90(sys.argv[1], sys.argv[2], a_type=sys.argv[3], b_type=sys.argv[4])
    print(json.dumps({"ptx": k.asm["ptx"], "shared": k.metadata.shared}))
""")


def _tools():
    import os
    import triton.backends.nvidia as nv
    from triton.backends.nvidia.compiler import get_ptxas
    return get_ptxas(90).path, os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump")


@pytest.fixture(scope="module", params=[("tensorwise", "ws_s3"), ("rowwise", "ws_s3"), ("blockwise", "ws_s3"),
                                        ("blockwise_cols", "ws_s3"), ("tensorwise", "wsfast_n256_s4"),
                                        ("tensorwise", "ws_s3_g16_eo"), ("rowwise", "ws_s3_g16_eo"),
                                        ("blockwise", "ws_s3_g16_ss"), ("blockwise_cols", "ws_s3_g16_ss"),
                                        ("blockwise", "ws_s3_g16_ss_eo"), ("blockwise_cols", "ws_s3_g16_ss_eo")],
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
    c = ws.WS_CONFIGS[cfg]
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
    fast, bn = ws.WS_CONFIGS[cfg][:2]
    assert f"QGMMA.64x{bn}x32.F32.E4M3.E4M3" in sass
    if fast:
        return
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
        if ws.WS_CONFIGS[cfg].smem_scales and mode.startswith("blockwise"):
            assert ldg <= (2 if mode == "blockwise" else 0), (ldg, cfg)
            assert any(re.search(r"\bLDS\b", x) for x in body)
            assert bars <= 2, bars
        elif mode.startswith("blockwise"):
            assert ldg >= 6, ldg


def test_scale_rows_for_tma():
    """``_chunk_rows``: unit column stride, row stride a multiple of 4 elements, 16-byte base, the
    same values; no copy when the scales already are so."""
    g = torch.Generator().manual_seed(5)
    for chunks, n in ((3, 8), (5, 1030), (9, 1001), (1, 1)):
        s = torch.rand(n, chunks, generator=g).t()  # (chunks, n) column-major, as sA.t() arrives
        r = ws._chunk_rows(s)
        assert torch.equal(r, s) and r.stride(1) == 1 and r.stride(0) % 4 == 0 and r.stride(0) >= n
        assert r.data_ptr() % 16 == 0
        assert ws._chunk_rows(r) is r
    c = torch.rand(4, 1024, generator=g)
    assert ws._chunk_rows(c) is c


def test_configs_fit_an_sm():
    for name, c in ws.WS_CONFIGS.items():
        ring = 2 * c.stages * c.subk * (128 + 128) * 4 if c.smem_scales else 0  # sA and sB rows a chunk
        assert (c.stages * c.subk * (128 * 128 + c.block_n * 128)) + ring <= SMEM_LIMIT - 1024, name
        assert c.fast or (c.subk == 2 and c.block_n == 128), name
        assert c.maxnreg * 12 * 32 <= REGS_PER_SM, name  # 3 warp groups (the producer's warp rounds up)
        default_regs = 3 * c.maxnreg - c.consumer_regs - c.producer_regs  # what the default consumer is left
        assert all(r % 8 == 0 and 24 <= r <= 256 for r in (c.consumer_regs, c.producer_regs, default_regs)), name
        assert default_regs >= c.consumer_regs, name  # both consumers hold the same accumulators
    assert set(ws.WS_DEFAULT.values()) <= set(ws.WS_CONFIGS)
    assert not ws.WS_CONFIGS[ws.WS_DEFAULT["promote"]][0] and ws.WS_CONFIGS[ws.WS_DEFAULT["fast"]][0]


def test_variant_ws_falls_back_exactly_on_the_cpu():
    """Where the Gluon kernels decline (CPU, interpreter), variant="ws" is the plain-Triton GEMM."""
    from lowbit.dtypes import FP8Tensor
    from lowbit.kernels.gemm import fp8_scaled_mm
    from lowbit.scaling import Blockwise, Current
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(64, 256, generator=g), torch.randn(96, 256, generator=g)
    for recipe, fast in ((Current(), False), (Current(), True), (Blockwise(), False)):
        a = FP8Tensor.from_float(x, recipe, "input")
        b = FP8Tensor.from_float(w, recipe, "weight").t()
        got = fp8_scaled_mm(a, b, torch.float32, fast_accum=fast, variant="ws")
        want = fp8_scaled_mm(a, b, torch.float32, fast_accum=fast, variant="triton")
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="variant"):
        fp8_scaled_mm(a, b, torch.float32, variant="nope")



def test_auto_offers_promoting_gemms_of_128_rows_and_more_to_gluon():
    from lowbit.kernels.gemm import _gluon_first
    assert _gluon_first(128, False, "auto") and _gluon_first(8192, False, "auto")
    assert not _gluon_first(64, False, "auto") and not _gluon_first(16, False, "auto")
    assert not _gluon_first(8192, True, "auto")  # fast accumulation: the plain-Triton kernel
    assert _gluon_first(16, True, "ws") and _gluon_first(16, False, "ws")
    # K-scaled (blockwise) GEMMs promote anyway: fast_accum does not keep them off the Gluon kernel
    assert _gluon_first(8192, True, "auto", k_scaled=True) and not _gluon_first(64, True, "auto", k_scaled=True)


def test_k_scaled_gemms_ignore_fast_accum():
    """A blockwise (K-scaled) GEMM is promoted every chunk either way: the same bits with and
    without fast_accum, on every path the CPU runs."""
    from lowbit.dtypes import FP8Tensor
    from lowbit.kernels.gemm import fp8_scaled_mm
    from lowbit.scaling import MX, Blockwise
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(64, 384, generator=g), torch.randn(96, 384, generator=g)
    for recipe in (Blockwise(), MX()):
        a = FP8Tensor.from_float(x, recipe, "input")
        b = FP8Tensor.from_float(w, recipe, "weight").t()
        for variant in ("auto", "triton", "pointer"):
            assert torch.equal(fp8_scaled_mm(a, b, torch.float32, fast_accum=True, variant=variant),
                               fp8_scaled_mm(a, b, torch.float32, fast_accum=False, variant=variant)), variant


def test_epilogue_overlap_where_measured():
    """The overlapped epilogue is the default for large tensorwise / rowwise outputs, with or
    without a bias, and the scale ring for the blockwise modes (what the H200 A/B measured and
    checked bitwise); small GEMMs keep the configurations without the overlap."""
    assert ws.promote_config(8192, 8192, "tensorwise") == ws.promote_config(16384, 14336, "rowwise") == "ws_s3_g16_eo"
    assert ws.promote_config(8200, 8320, "tensorwise") == "ws_s3_g16_eo"
    assert ws.promote_config(4096, 4096, "tensorwise") == "ws_s3"
    # blockwise modes: the scale ring at every size
    assert ws.promote_config(8192, 8192, "blockwise") == "ws_s3_g16_ss_eo"
    assert ws.promote_config(8192, 8192, "blockwise_cols") == "ws_s3_g16_ss"
    assert ws.promote_config(4096, 4096, "blockwise") == ws.promote_config(14336, 4096, "blockwise_cols") == "ws_s3_ss"
    assert ws.WS_CONFIGS["ws_s3_g16_eo"].epi_overlap and not ws.WS_CONFIGS["ws_s3_g16"].epi_overlap

"""CPU checks of the Gluon FP8 GEMM (lowbit/kernels/gemm_gluon.py): it compiles for sm_90a under the
installed triton, the schedule survives to PTX and SASS (async wgmma, ``wait_group 1`` inside the
K loop, ptxas keeps it: no serialization / injected waits, no spills, shared memory fits), and
the launchers decline what they can't run. The numbers are checked on the GPU by
``benchmarks/gemm_gluon.py``."""
import re
import subprocess
import textwrap

import pytest
import torch

from lowbit.kernels import gemm_gluon as gg
from sm90 import run_script

pytestmark = pytest.mark.skipif(gg.gluon_available() is not None, reason=f"no Gluon: {gg.gluon_available()}")

SMEM_LIMIT = 227 * 1024  # sm_90 per-block opt-in maximum

# compiled in a child without TRITON_INTERPRET: under the interpreter triton's own jit helpers
# (gl.cdiv -> tl.cdiv) are interpreted functions, which a Gluon compile cannot always call
_COMPILE = textwrap.dedent("""
    import json, sys
    from lowbit.kernels import gemm_gluon as gg
    k = gg.compile_for_sm90(sys.argv[1], sys.argv[2], a_type=sys.argv[3], b_type=sys.argv[4])
    print(json.dumps({"ptx": k.asm["ptx"], "shared": k.metadata.shared}))
""")


def _compile(mode, cfg, a_type="fp8e4nv", b_type="fp8e4nv"):
    return run_script(_COMPILE, mode, cfg, a_type, b_type)


def _tools():
    import os
    import triton.backends.nvidia as nv
    from triton.backends.nvidia.compiler import get_ptxas
    return get_ptxas(90).path, os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump")


@pytest.fixture(scope="module", params=[("tensorwise", gg.DEFAULT_CONFIG["tensorwise"]),
                                        ("rowwise", gg.DEFAULT_CONFIG["rowwise"]),
                                        ("blockwise", gg.DEFAULT_CONFIG["blockwise"]),
                                        ("blockwise", "n2_n128_s6_u2")],
                ids=lambda p: "-".join(p))
def compiled(request, tmp_path_factory):
    """(PTX, ptxas -v stderr, SASS, shared bytes) of one configuration (a few seconds each)."""
    mode, cfg = request.param
    k = _compile(mode, cfg)
    ptx = k["ptx"]
    d = tmp_path_factory.mktemp(f"{mode}_{cfg}")
    (d / "k.ptx").write_text(ptx)
    ptxas, cuobjdump = _tools()
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(d / "k.ptx"), "-o", str(d / "k.cubin")],
                       capture_output=True, text=True, check=True)
    sass = subprocess.run([cuobjdump, "-sass", str(d / "k.cubin")], capture_output=True, text=True,
                          check=True).stdout
    return ptx, r.stderr, sass, k["shared"]


def _loops(ptx: str):
    """Bodies of the PTX loops: text from a label to the last branch back to it."""
    for m in re.finditer(r"^(\$L__BB\d+_\d+):", ptx, flags=re.M):
        back = [b.start() for b in re.finditer(rf"bra(\.uni)?\s+{re.escape(m.group(1))};", ptx)
                if b.start() > m.end()]
        if back:
            yield ptx[m.end():back[-1]]


def test_ptx_has_async_wgmma_and_wait_one_in_the_k_loop(compiled):
    ptx = compiled[0]
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n(64|128)k32\.f32\.e4m3\.e4m3", ptx)
    inner = [b for b in _loops(ptx) if "wgmma.mma_async" in b and "mbarrier.try_wait" in b]
    assert inner, "no loop issues wgmma"
    assert any(re.search(r"wgmma\.wait_group\.sync\.aligned\s+1;", b) for b in inner), \
        "the K loop must wait for all but one wgmma group (promotion overlaps the next MMA)"
    assert any("add.rn.f32" in b or "fma.rn.f32" in b for b in inner), "promotion inside the loop"


def test_ptxas_keeps_the_pipeline(compiled):
    _, log, sass, _ = compiled
    for code in ("C7510", "C7514", "C7515", "C7517"):  # serialized / injected-wait diagnostics
        assert code not in log, log
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    assert regs <= 255
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass  # the partial wait reached the machine code
    assert sass.count("QGMMA") >= 16


def test_shared_memory_fits(compiled):
    assert 0 < compiled[3] <= SMEM_LIMIT


def _fp8(shape, device="cpu"):
    return torch.randn(shape, device=device).to(torch.float8_e4m3fn)


def test_launcher_declines_cpu_and_bad_inputs():
    M, N, K = 256, 256, 512
    qa, qb = _fp8((M, K)), _fp8((N, K)).t()
    one = torch.ones((), dtype=torch.float32)
    assert gg.gluon_scaled_mm(qa, one, qb, one, "tensorwise") is None  # CPU tensors
    assert "CUDA" in gg.gluon_support(qa, one, qb, one, "tensorwise")
    assert "mode" in gg.gluon_support(qa, one, qb, one, "mx")
    assert "FP8" in gg.gluon_support(qa.float(), one, qb, one, "tensorwise")
    assert gg.gluon_scaled_mm(qa, one, qb, one, "blockwise") is None


def test_front_end_declines_on_cpu_and_maps_recipes():
    from lowbit.dtypes import FP8Tensor
    from lowbit.kernels.gemm import gemm_plan
    from lowbit.scaling import MX, Blockwise, Current, Rowwise
    x, w = torch.randn(256, 512), torch.randn(384, 512)
    for recipe, mode in ((Current(), "tensorwise"), (Rowwise(), "rowwise"), (Blockwise(), "blockwise"),
                         (MX(), None)):
        a = FP8Tensor.from_float(x, recipe, "input")
        b = FP8Tensor.from_float(w, recipe, "weight").t()
        plan = gemm_plan(a, b)
        assert not isinstance(plan, str)
        assert gg._plan_mode(plan) == mode
        assert gg.gluon_fp8_scaled_mm(a, b, torch.bfloat16) is None  # CPU: declined, never raises
        assert gg.gluon_fp8_scaled_mm(a, b, torch.bfloat16, fast_accum=True) is None
    # wgrad's operands: both 1x128 along K (tokens), so B has 128x1 blocks: one scale per column a chunk
    a = FP8Tensor.from_float(x, Blockwise(), "input")
    b = FP8Tensor.from_float(w, Blockwise(), "input").t()
    assert gg._plan_mode(gemm_plan(a, b)) == "blockwise_cols"


def test_configs_are_consistent():
    for name, (subk, nsub, bn, stages, group_m, unroll) in gg.CONFIGS.items():
        assert subk * nsub == 2 and bn % nsub == 0 and stages >= 2, name
        smem = stages * (subk * 128 * 128 + 2 * (bn // nsub) * 128)
        assert smem <= SMEM_LIMIT - 1024, name
    for mode, name in gg.DEFAULT_CONFIG.items():
        assert name in gg.CONFIGS


def test_mixed_e5m2_e4m3_compiles():
    """Gradients (E5M2) x weights (E4M3), the dgrad shape of the HYBRID recipe."""
    k = _compile("tensorwise", gg.DEFAULT_CONFIG["tensorwise"], a_type="fp8e5", b_type="fp8e4nv")
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e5m2.e4m3" in k["ptx"]

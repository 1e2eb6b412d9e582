"""CPU checks of the one-read Gluon cast of 1x128 blocks with the transposed copy
(lowbit/kernels/quantize_fp8_gluon_t.py): it compiles for sm_90a with the installed triton, keeps
its tile in registers (no spills), reads x by TMA into a ring of shared memory, stores both copies
as 8-byte runs (q along x's rows, qt along x's columns: no byte stores, no layout conversion
through shared memory for the codes), and the launcher takes only what it can run. Its bits are
checked on the GPU against the torch reference by ``benchmarks/quantize.py`` (RESULTS.md); on the
CPU the split casts, which it replaces there, are checked bit for bit by test_quantize_*.py."""
import re
import subprocess

import pytest
import torch

from lowbit.kernels import gemm_gluon as gg
from lowbit.kernels import quantize_fp8_gluon_t as qg
from sm90 import run_script

pytestmark = pytest.mark.skipif(gg.gluon_available() is not None, reason=f"no Gluon: {gg.gluon_available()}")

_COMPILE = """
import json, sys
from lowbit.kernels import quantize_fp8_gluon_t as qg
k = qg.compile_for_sm90(sys.argv[1] == "e4m3")
print(json.dumps({"ptx": k.asm["ptx"], "shared": k.metadata.shared}))
"""


@pytest.fixture(scope="module", params=["e4m3", "e5m2"])
def compiled(request, tmp_path_factory):
    """(PTX, ptxas -v stderr, SASS, shared bytes)."""
    from triton.backends.nvidia.compiler import get_ptxas
    import os
    import triton.backends.nvidia as nv
    k = run_script(_COMPILE, request.param)
    d = tmp_path_factory.mktemp(request.param)
    (d / "k.ptx").write_text(k["ptx"])
    r = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(d / "k.ptx"), "-o", str(d / "k.cubin")],
                       capture_output=True, text=True, check=True)
    cuobjdump = os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump")
    sass = subprocess.run([cuobjdump, "-sass", str(d / "k.cubin")], capture_output=True, text=True, check=True).stdout
    return k["ptx"], r.stderr, sass, k["shared"]


def test_tile_stays_in_registers(compiled):
    _, log, _, shared = compiled
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    assert 0 < shared <= 227 * 1024


def test_x_arrives_by_tma_and_leaves_as_8_byte_runs(compiled):
    _, _, sass, _ = compiled
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass)
    assert any(o.startswith("UTMALDG") for o in ops)  # x by TMA, no global load of x
    assert not any(o.startswith("LDG") and not o.endswith("2D") for o in ops)
    assert ops.count("LDS.128") >= 8  # a thread's 8 rows of 8 bf16 from the ring, 16 bytes each
    # both copies, each path (finite / with NaN or inf): 8 rows of q and 8 columns of qt a thread
    assert ops.count("STG.E.64") == 32, [o for o in ops if o.startswith("STG")]
    assert not any(o.startswith("STG.E.U8") or o.startswith("STG.E.U16") for o in ops)


def test_launcher_takes_only_what_it_can_run():
    x = torch.zeros(256, 256, dtype=torch.bfloat16)
    q = torch.empty(256, 256, dtype=torch.uint8)
    assert not qg.gluon_block_t_support(x, q, 128)  # CPU
    meta = torch.zeros(256, 256, dtype=torch.bfloat16, device="meta")
    qm = torch.empty(256, 256, dtype=torch.uint8, device="meta")
    assert not qg.gluon_block_t_support(meta, qm, 128)
    assert not qg.gluon_block_t_support(x.float(), q, 128) and not qg.gluon_block_t_support(x, q, 64)

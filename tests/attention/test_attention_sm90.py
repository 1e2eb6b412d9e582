"""The attention kernels compiled for sm_90 on the CPU (no GPU): every configuration in their
SCAN_SPECS (the shipped tunings of head dim 128) is free of FMA-contraction hazards
(lowbit.fma_guard), runs its products on FP8 wgmma (``wgmma.mma_async ... e4m3.e4m3``, never
``mma.sync``), and ptxas assembles it without spilling registers."""
import os
import re
import subprocess
import tempfile

import pytest

from lowbit.fma_guard import collect_specs, scan
from lowbit.fma_guard.compile import compile_kernel

PACKAGE = "lowbit.kernels.triton.attention"
SPECS = collect_specs(PACKAGE)


def _ptxas_verbose(ptx: str) -> str:
    from triton.backends.nvidia.compiler import get_ptxas
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        res = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", src, "-o", os.path.join(d, "k.cubin")],
                             capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout + res.stderr


def test_every_kernel_has_a_spec():
    assert SPECS.errors == () and SPECS.missing == (), SPECS.format()
    assert {s.name for s in SPECS.specs} == {"quantize_kernel", "attention_fwd_kernel", "attention_dkdv_kernel",
                                             "attention_dq_kernel"}


@pytest.mark.parametrize("spec", SPECS.specs, ids=lambda s: f"{s.name}-{s.constexprs.get('DP')}")
def test_sm90_build(spec):
    report = scan(spec.kernel, spec.signature, spec.constexprs, target="sm_90", num_warps=spec.num_warps,
                  num_stages=spec.num_stages)
    assert report.clean, report.format()
    ptx = compile_kernel(spec.kernel, spec.signature, spec.constexprs, target="sm_90", num_warps=spec.num_warps,
                         num_stages=spec.num_stages).ptx
    assert "mma.sync" not in ptx
    mmas = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.\w+\.f32\.(\w+)\.(\w+)", ptx))
    assert mmas == ({("bf16", "bf16")} if spec.name == "quantize_kernel" else {("e4m3", "e4m3")}), mmas
    usage = _ptxas_verbose(ptx)
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", usage)]
    assert spills and not any(spills), usage

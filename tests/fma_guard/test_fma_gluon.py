"""The Gluon kernels (lowbit's production Hopper GEMMs) are covered by ``GLUON_SPECS``, compiled for
sm_90a and scanned by ``lowbit audit fma --all``; an uncovered Gluon kernel is named as missing, an
entry that cannot compile for the target is named as not scanned; compiling prints progress."""
import os

import pytest

from lowbit.cli import main
from lowbit.fma_guard import collect_specs
from lowbit.fma_guard.gluon import GLUON_SPECS
from lowbit.kernels.triton.gemm_fp8 import gluon_ws

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
pytestmark = pytest.mark.skipif(gluon_ws.gluon_available() is not None,
                                reason=f"no Gluon in this triton: {gluon_ws.gluon_available()}")


def test_gluon_kernels_are_covered_by_the_table():
    res = collect_specs()
    assert res.missing == (), res.format()
    assert {g.kernel for g in res.gluon} == {"_fp8_gemm_ws_kernel"}
    assert set(res.gluon) == set(GLUON_SPECS)


def test_an_uncovered_gluon_kernel_is_missing(monkeypatch):
    monkeypatch.syspath_prepend(FIX)
    res = collect_specs("fma_fake_gluon")
    assert res.missing == (("fma_fake_gluon.orphan", "orphan_kernel"),)
    assert res.gluon == () and not res.ok


def test_audit_fma_all_scans_the_ws_kernel_with_progress(capsys):
    rc = main(["audit", "fma", "--all", "--package", "lowbit.kernels.triton.gemm_fp8.gluon_ws"])
    out = capsys.readouterr()
    assert rc == 0, out.out
    assert "2 kernel configuration(s)" in out.out and "(0 Triton, 2 Gluon)" in out.out
    assert "clean   _fp8_gemm_ws_kernel[tensorwise] (sm_90a" in out.out
    assert "clean   _fp8_gemm_ws_kernel[blockwise_cols] (sm_90a" in out.out
    assert "audit fma: compiling" in out.err and "2/2 done" in out.err


def test_other_targets_name_the_gluon_kernels_as_not_scanned(capsys):
    rc = main(["audit", "fma", "--all", "--package", "lowbit.kernels.triton.gemm_fp8.gluon_ws", "--arch", "sm_80"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "2 not scanned" in out
    assert "NOT SCANNED lowbit.kernels.triton.gemm_fp8.gluon_ws._fp8_gemm_ws_kernel[tensorwise]: Gluon kernels compile " \
           "for sm_90a only" in out

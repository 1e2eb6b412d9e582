"""Every kernel lowbit ships, Triton and Gluon, is scanned (compiled for sm_90 on the CPU) and clean;
the collector reports import failures, malformed SCAN_SPECS and kernels without a spec."""
import os

from lowbit.fma_guard import collect_specs, scan_shipped

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def test_collector_on_a_planted_package(monkeypatch):
    monkeypatch.syspath_prepend(FIX)
    res = collect_specs("fma_fake_kernels")
    assert [(s.module, s.name) for s in res.specs] == [("fma_fake_kernels.good", "scale_kernel")]
    errors = dict(res.errors)
    assert set(errors) == {"fma_fake_kernels.broken", "fma_fake_kernels.badspec"}
    assert "planted import failure" in errors["fma_fake_kernels.broken"]
    assert "signature" in errors["fma_fake_kernels.badspec"]
    # the helper _twice is covered by the kernel that calls it; the unlisted kernels are not
    assert res.missing == (("fma_fake_kernels.badspec", "listed_wrongly"), ("fma_fake_kernels.nospec",
                                                                            "unlisted_kernel"))
    assert not res.ok


def test_every_shipped_kernel_is_scanned_and_clean():
    res = scan_shipped()
    assert res.errors == (), res.format()
    assert res.missing == (), res.format()
    assert len(res.reports) == len(res.specs) + len(res.gluon) and res.not_scanned == ()
    assert {"_fp8_gemm_ws_kernel[tensorwise]", "_fp8_gemm_ws_kernel[blockwise_cols]"} <= {r.kernel for r in res.reports}
    dirty = [r.format() for r in res.reports if not r.clean]
    assert not dirty, "\n".join(dirty)

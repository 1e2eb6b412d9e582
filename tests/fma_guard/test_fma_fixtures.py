"""The scan on planted hazards and their safe twins, compiled for sm_90 on the CPU.

Each hazardous kernel must be reported exactly at its ``# HAZARD`` lines, with the right kind,
pointing at fma instructions of its PTX; each safe twin must scan clean; and every kernel must scan
clean when compiled with ``enable_fp_fusion=False`` (what ``guard`` launches).
"""
import pytest

from fma_fixtures import fixture_cases, hazard_lines, load_fixture
from lowbit.fma_guard import scan
from lowbit.fma_guard.dataflow import is_contraction
from lowbit.fma_guard.ptx import parse_ptx
from lowbit.fma_guard.scan import CANCEL, COMPARE, MAX

MODS = {name: load_fixture(name, tag="_cases") for name in ("online_softmax", "rowwise", "attention", "compare")}
CASES = fixture_cases(MODS)
EXPECTED_KIND = {"variance_rows": CANCEL, "top_mask": COMPARE}


@pytest.mark.parametrize("name,kernel,sig,cx", CASES, ids=[c[0] for c in CASES])
def test_flagged_at_marked_lines_and_twins_clean(name, kernel, sig, cx):
    report = scan(kernel, sig, cx)
    expected = hazard_lines(kernel)
    assert {f.line for f in report.findings} == expected, report.format()
    assert report.clean == (not expected)
    ptx = report.ptx.splitlines()
    for f in report.findings:
        assert f.kind == EXPECTED_KIND.get(name, MAX)
        assert f.path == kernel.fn.__code__.co_filename and f.kernel == name
        assert "HAZARD" in f.source_text
        assert f.fix and f.ptx_lines
        head = ptx[f.ptx_lines[0] - 1].split()[0]
        assert head.startswith(("fma", "setp")), head  # the reported PTX line is the contracted op / the compare


@pytest.mark.parametrize("name,kernel,sig,cx", [c for c in CASES if hazard_lines(c[1])],
                         ids=[c[0] for c in CASES if hazard_lines(c[1])])
def test_fusion_off_is_clean(name, kernel, sig, cx):
    report = scan(kernel, sig, cx, enable_fp_fusion=False)
    assert report.clean, report.format()
    fn = parse_ptx(report.ptx)  # no contraction left at the marked lines (libdevice's own fma may stay)
    fused_lines = {fn.user_location(i.loc)[1] for i in fn.instrs if is_contraction(i) and i.loc is not None}
    assert not fused_lines & hazard_lines(kernel)
    assert scan(kernel, sig, cx).n_fma > report.n_fma
    # the IR still holds the contractible pattern: the fusion flag, not the source, decides
    assert report.ir_contractions


def test_max_finding_names_rounded_product_and_reduction():
    sm = MODS["online_softmax"]
    report = scan(sm.online_softmax_exp2_before, sm.SIGNATURE, sm.CONSTEXPRS)
    first = min(report.findings, key=lambda f: f.line)
    roles = dict(first.related)
    mul_line = int(roles["rounded product"].rsplit(":", 1)[1])
    red_line = int(roles["max/min reduction"].rsplit(":", 1)[1])
    src = open(first.path).read().splitlines()
    # the reduction is located exactly; the mul, hoisted next to it by LLVM, carries a nearby line
    assert "tl.max" in src[red_line - 1]
    assert first.line - 3 <= mul_line <= red_line
    assert first.orientation == 1 and "param:" in " ".join(first.multiplicands)


def test_ir_shows_the_reused_product():
    """The source computes qk once; the IR fmul feeds both the max and the subtraction."""
    sm = MODS["online_softmax"]
    report = scan(sm.online_softmax_exp2_before, sm.SIGNATURE, sm.CONSTEXPRS)
    assert any("llvm.maxnum.f32" in c.other_uses for c in report.ir_contractions)


def test_example_args_give_the_same_scan():
    torch = pytest.importorskip("torch")
    rw = MODS["rowwise"]
    x = torch.zeros(4, 1024)
    by_args = scan(rw.variance_rows, [x, torch.zeros(4), torch.zeros(4), 1024])
    by_sig = scan(rw.variance_rows, rw.VAR_SIGNATURE, rw.CONSTEXPRS)
    assert [f.source for f in by_args.findings] == [f.source for f in by_sig.findings]


def test_interpreted_kernels_are_scanned_too(monkeypatch):
    """Kernels decorated under TRITON_INTERPRET=1 (as lowbit's CPU tests do) compile for sm_90 as well."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    sm = load_fixture("online_softmax", tag="_interp")
    assert type(sm.online_softmax_exp2_before).__name__ == "InterpretedFunction"
    report = scan(sm.online_softmax_exp2_before, sm.SIGNATURE, sm.CONSTEXPRS)
    assert {f.line for f in report.findings} == hazard_lines(sm.online_softmax_exp2_before)


@pytest.mark.parametrize("sig,cx,msg", [
    ({"X": "*fp32", "P": "*fp32", "ARG": "*fp32", "s": "fp32"}, {"BLOCK": 256}, "n_cols"),
    ({"X": "*fp32", "P": "*fp32", "ARG": "*fp32", "s": "fp32", "n_cols": "i32"}, {}, "BLOCK"),
    ({"X": "*fp32", "P": "*fp32", "ARG": "*fp32", "s": "fp32", "n_cols": "i32", "bogus": "i32"}, {"BLOCK": 256},
     "bogus"),
])
def test_bad_signature_is_a_clear_error(sig, cx, msg):
    sm = MODS["online_softmax"]
    with pytest.raises(ValueError, match=msg):
        scan(sm.online_softmax_exp2_before, sig, cx)


def test_bad_target_and_non_kernel():
    sm = MODS["online_softmax"]
    with pytest.raises(ValueError, match="target"):
        scan(sm.online_softmax_exp2_before, sm.SIGNATURE, sm.CONSTEXPRS, target="gfx90a")
    with pytest.raises(TypeError, match="not a Triton kernel"):
        scan(len, {}, {})

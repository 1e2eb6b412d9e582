"""The PTX parser, def-use chains and hazard rules on small hand-written PTX (no compiler needed).

Covers what Triton 3.6 / 3.9 emit: untyped ``%r`` and typed ``%f`` registers, inline-asm loads with
``{ }`` operands and scoped registers, predicated definitions, registers redefined in branches,
shared-memory round trips, ``.loc`` with ``inlined_at``, and ptxas-contractible mul/add pairs.
"""
import pytest

from lowbit.fma_guard.ptx import parse_ptx
from lowbit.fma_guard.scan import CANCEL, MAX, scan_ptx


def ptx(body: str, files=('"/src/k.py"', '"/site/triton/language/standard.py"')) -> str:
    head = (".version 8.4\n.target sm_90a\n.address_size 64\n"
            ".visible .entry k(\n\t.param .u64 k_param_0,\n\t.param .f32 k_param_1\n)\n{\n"
            "\t.reg .b32 %r<100>;\n\t.reg .f32 %f<100>;\n\t.reg .pred %p<9>;\n\t.reg .b64 %rd<9>;\n")
    tail = "\tret;\n}\n" + "".join(f"\t.file\t{i + 1} {f}\n" for i, f in enumerate(files))
    return head + body + tail


LOAD_X = """\tld.param.u64 %rd1, [k_param_0];
\tld.param.f32 %f1, [k_param_1];
\t.loc 1 10 5
\t// begin inline asm
\tmov.u32 %r1, 0x0;
\t@%p1 ld.global.b32 { %r1 }, [ %rd1 + 0 ];
\t// end inline asm
\tmov.b32 %f2, %r1;
"""


def test_operands_predicates_and_scoped_registers():
    fn = parse_ptx(ptx(LOAD_X + """\t{ .reg .b32 tmp; mov.b32 tmp, %f2; mov.b32 %r5, tmp; }
\tld.shared.v2.b32 {%r6, %r7}, [%r5+16];
"""))
    ld = [i for i in fn.instrs if i.base == "ld" and i.space is None or i.opcode.startswith("ld.global")][0]
    assert ld.dests == ("%r1",) and ld.pred == "%p1" and ld.addr == ("%rd1",)
    # the predicated load does not kill the mov 0: both definitions reach the use
    use = [i for i in fn.instrs if i.text.startswith("mov.b32 %f2")][0]
    assert sorted(d.base for d in fn.producers("%r1", use)) == ["ld", "mov"]
    scoped = [i for i in fn.instrs if i.text.startswith("mov.b32 %r5")][0]
    assert scoped.args == ("tmp@1",)
    vec = [i for i in fn.instrs if i.text.startswith("ld.shared")][0]
    assert vec.dests == ("%r6", "%r7") and vec.space == "shared"


def test_reaching_definitions_follow_branches():
    body = """\tmov.f32 %f1, 0f3F800000;
\tsetp.lt.f32 %p1, %f1, 0f40000000;
\t@%p1 bra $L__BB0_2;
\tmov.f32 %f3, %f1;
\tbra $L__BB0_3;
$L__BB0_2:
\tmul.f32 %f3, %f1, %f1;
\tadd.f32 %f4, %f3, %f1;
$L__BB0_3:
\tadd.f32 %f5, %f3, %f1;
"""
    fn = parse_ptx(ptx(body))
    in_branch = [i for i in fn.instrs if i.text.startswith("add.f32 %f4")][0]
    at_join = [i for i in fn.instrs if i.text.startswith("add.f32 %f5")][0]
    assert [d.base for d in fn.producers("%f3", in_branch)] == ["mul"]
    assert sorted(d.base for d in fn.producers("%f3", at_join)) == ["mov", "mul"]


def test_loc_resolves_inlined_frames_to_user_lines():
    body = """\t.loc 1 7 3
\tmov.f32 %f1, 0f00000000;
\t.loc 2 216 16, function_name $L__info_string0, inlined_at 1 11 9
\tshfl.sync.bfly.b32 %r2, %r1, 16, 31, -1;
\t.loc 2 196 12, function_name $L__info_string0, inlined_at 2 216 16
\tmax.f32 %f2, %f1, %f1;
"""
    fn = parse_ptx(ptx(body))
    locs = [fn.user_location(i.loc) for i in fn.instrs if i.base != "ret"]
    assert locs == [("/src/k.py", 7), ("/src/k.py", 11), ("/src/k.py", 11)]
    # triton 3.6's LLVM names the inlining frames only in the comment
    old = "\t.loc 2 170 27 // standard.py:170:27 @[ standard.py:191:40 @[ k.py:23:43 ] ]\n\tmax.f32 %f2, %f1, %f1;\n"
    fn = parse_ptx(ptx(old))
    assert fn.user_location(fn.instrs[0].loc) == ("/src/k.py", 23)


SOFTMAX_ROW = LOAD_X + """\t.loc 1 11 10
\tmulRN.f32 %f3, %f1, %f2;
\t.loc 1 12 9
\tshfl.sync.bfly.b32 %r10, %f3, 16, 31, -1;
\tmax.f32 %f4, %f3, %r10;
\tst.shared.b32 [%r20], %f4;
\tbar.sync 0;
\tld.shared.b32 %f5, [%r21];
\tmax.f32 %f6, %f5, %f5;
\t.loc 1 13 17
SUB"""


@pytest.mark.parametrize("sub,rn,flagged,by_ptxas", [
    ("\tneg.f32 %f7, %f6;\n\tfma.rn.f32 %f8, %f1, %f2, %f7;\n", "", True, False),      # LLVM contracted
    ("\tneg.f32 %f7, %f6;\n\tfma.rn.f32 %f8, %f2, %f1, %f7;\n", "", True, False),      # operands swapped
    ("\tsub.f32 %f7, 0f00000000, %f6;\n\tfma.rn.f32 %f8, %f1, %f2, %f7;\n", "", True, False),  # 0 - m
    ("\tsub.f32 %f8, %f3, %f6;\n", "", True, True),                                       # ptxas may contract
    ("\tsub.rn.f32 %f8, %f3, %f6;\n", ".rn", False, False),                               # explicit rounding
    ("\tfma.rn.f32 %f8, %f1, %f2, %f6;\n", "", False, False),                            # a sum, not a difference
])
def test_max_rule_through_shuffles_and_shared_memory(sub, rn, flagged, by_ptxas):
    rep = scan_ptx(ptx(SOFTMAX_ROW.replace("RN", rn).replace("SUB", sub)))
    assert [f.kind for f in rep.findings] == ([MAX] if flagged else [])
    if flagged:
        f = rep.findings[0]
        assert f.line == 13 and f.by_ptxas == by_ptxas
        assert dict(f.related) == {"rounded product": "/src/k.py:11", "max/min reduction": "/src/k.py:12"}
        assert set(f.multiplicands) >= {"param:k_param_1"}


def test_error_free_product_is_not_a_hazard():
    body = LOAD_X + """\t.loc 1 11 1
\tmul.rn.f32 %f3, %f1, %f2;
\tneg.f32 %f4, %f3;
\tfma.rn.f32 %f5, %f1, %f2, %f4;
"""
    assert scan_ptx(ptx(body)).clean


def test_cancellation_needs_a_reduction():
    """E[x^2] - mean^2 with mean and the sum of squares reduced across lanes; without the shuffles
    (two unrelated products of one load) it is not reported."""
    body = LOAD_X + """\t.loc 1 20 1
\tshfl.sync.bfly.b32 %r30, %f2, 16, 31, -1;
\tadd.f32 %f10, %f2, %r30;
\tmul.f32 %f11, %f10, 0f3C800000;
\tmul.f32 %f12, %f2, %f2;
\tshfl.sync.bfly.b32 %r31, %f12, 16, 31, -1;
\tadd.f32 %f13, %f12, %r31;
\t.loc 1 21 1
\tneg.f32 %f14, %f11;
\tfma.rn.f32 %f15, %f14, %f11, %f13;
"""
    rep = scan_ptx(ptx(body))
    assert [(f.kind, f.line) for f in rep.findings] == [(CANCEL, 21)]
    no_reduction = body.replace("shfl.sync.bfly.b32 %r30, %f2, 16, 31, -1", "mov.b32 %r30, %f2") \
                       .replace("shfl.sync.bfly.b32 %r31, %f12, 16, 31, -1", "mov.b32 %r31, %f12")
    assert scan_ptx(ptx(no_reduction)).clean


def test_no_entry_is_an_error():
    with pytest.raises(ValueError, match="no .entry"):
        parse_ptx(".version 8.4\n.target sm_90a\n")

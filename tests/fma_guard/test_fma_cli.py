"""``lowbit audit fma``: exit status and output for a user's file, bad requests, and --all."""
import json
import os

import pytest

from lowbit.cli import main

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
ROW = os.path.join(FIX, "rowwise.py")
VAR_SIG = "X=*fp32,VAR=*fp32,RSTD=*fp32"


def run(capsys, *argv):
    rc = main(["audit", "fma", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_hazard_gives_exit_1_and_names_the_line(capsys):
    rc, out, _ = run(capsys, f"{ROW}:variance_rows", "--signature", VAR_SIG, "--constexpr", "N=1024", "--explain")
    assert rc == 1
    assert f"{ROW}:38" in out and "contracted-vs-rounded-cancellation" in out and "fix:" in out
    assert "exact counterexample" in out and "< 0" in out


def test_clean_kernel_gives_exit_0_positional_signature(capsys):
    rc, out, _ = run(capsys, f"{ROW}:variance_rows_safe", "--signature", "*fp32,*fp32,*fp32", "--constexpr", "N=1024")
    assert rc == 0 and "0 hazard(s)" in out


def test_no_fusion_and_json(capsys):
    rc, out, _ = run(capsys, f"{ROW}:variance_rows", "--signature", VAR_SIG, "--constexpr", "N=1024",
                     "--no-fusion", "--json")
    assert rc == 0
    (rep,) = json.loads(out)
    assert rep["clean"] and rep["enable_fp_fusion"] is False


@pytest.mark.parametrize("argv,msg", [
    ([], "exactly one"),
    (["--all", f"{ROW}:variance_rows"], "exactly one"),
    ([f"{ROW}"], "FILE.py:KERNEL"),
    ([f"{FIX}/nope.py:k"], "no such file"),
    ([f"{ROW}:nope"], "no kernel named"),
    ([f"{ROW}:variance_rows"], "--signature"),
    ([f"{ROW}:variance_rows", "--signature", "*fp32,*fp32", "--constexpr", "N=1024"], "2 types for 3"),
    ([f"{ROW}:variance_rows", "--signature", "X=*fp32,*fp32,*fp32", "--constexpr", "N=1024"], "not both"),
    ([f"{ROW}:variance_rows", "--signature", VAR_SIG, "--constexpr", "N"], "NAME=VALUE"),
    ([f"{ROW}:variance_rows", "--signature", VAR_SIG, "--constexpr", "N=tl.nope"], "no 'nope'"),
    ([f"{ROW}:variance_rows", "--signature", VAR_SIG], "N"),
    ([f"{ROW}:LSE_SIGNATURE", "--signature", VAR_SIG], "not a Triton kernel"),
])
def test_bad_requests_exit_2_with_a_message(capsys, argv, msg):
    rc, _, err = run(capsys, *argv)
    assert rc == 2 and msg in err


def test_scan_specs_in_the_file_are_used(capsys, tmp_path):
    src = open(ROW).read() + ("\nSCAN_SPECS = ({'kernel': logsumexp_rows, 'signature': LSE_SIGNATURE, "
                              "'constexprs': CONSTEXPRS},)\n")
    f = tmp_path / "with_specs.py"
    f.write_text(src)
    rc, out, _ = run(capsys, f"{f}:logsumexp_rows")
    assert rc == 1 and "max-of-rounded-products" in out


def test_all_reports_errors_missing_specs_and_scans(capsys, monkeypatch):
    monkeypatch.syspath_prepend(FIX)
    rc, out, _ = run(capsys, "--all", "--package", "fma_fake_kernels")
    assert rc == 2  # a module fails to import, one lacks a spec
    assert "1 kernel configuration(s)" in out and "clean   scale_kernel" in out
    assert "ERROR fma_fake_kernels.broken" in out and "MISSING SCAN_SPECS entry: fma_fake_kernels.nospec" in out

"""``lowbit audit kernels``: the quick audit CI runs passes with its JSON schema; a planted cast,
GEMM or attention fault fails its row and the command exits 1; on a CPU without TRITON_INTERPRET the command
runs itself again under the interpreter."""
import json
import math
import types

import pytest
import torch

import lowbit.kernels
from lowbit.cli import main
from lowbit.scaling import Current, MX
from lowbit.validate import kernel_audit as AK
from lowbit.validate import check_attention, check_casts, check_gemm
from lowbit.validate.cli import run_audit_kernels
from lowbit.validate.kernel_checks import AuditConfig, CheckResult, KernelCheck

ROW_KEYS = {"kernel", "backend", "format", "shape", "inputs", "metric", "value", "limit", "passed", "detail"}


def test_quick_audit_passes_with_its_json_schema(capsys):
    rc = main(["audit", "kernels", "--quick", "--json"])
    out = capsys.readouterr()
    rep = json.loads(out.out)
    failed = [r for r in rep["results"] if not r["passed"]]
    assert rc == 0 and rep["passed"] is True, failed
    assert set(rep) == {"device", "quick", "backends", "passed", "results"} and rep["quick"] is True
    assert rep["device"] == "cpu" and rep["backends"] == ["triton", "torch"]
    assert all(set(r) == ROW_KEYS for r in rep["results"])
    kernels = {(r["kernel"], r["backend"]) for r in rep["results"]}
    assert {(k, b) for k in ("quantize_fp8", "quantize_fp8_t", "quantize_fp4", "scaled_mm", "attention")
            for b in ("triton", "torch")} <= kernels
    casts = [r for r in rep["results"] if r["metric"] == "max ULP"]
    gemms = [r for r in rep["results"] if r["kernel"] == "scaled_mm"]
    attention = [r for r in rep["results"] if r["kernel"] == "attention"]
    assert len(casts) + len(gemms) + len(attention) == len(rep["results"])
    assert all(r["value"] == 0 for r in casts) and all(0 < r["value"] <= 1 for r in gemms + attention)
    assert {r["format"] for r in casts} == {f"{label} {rec.format(role).name} {role}"
                                            for label, rec, role, _ in check_casts.CAST_CASES}
    assert {r["format"] for r in gemms} == {c[0] for c in check_gemm.GEMM_CASES}
    assert {r["inputs"].split(" ")[0] for r in casts + gemms} == {"adversarial"}
    assert len(attention) == 4 * 2 * len(check_attention.QUICK)  # out, dq, dk, dv x backends x shapes
    assert "audit kernels [" in out.err  # the progress bar


def _flip_one_code(q):
    bits = q._data.view(torch.uint8).clone()
    bits.view(-1)[5] ^= 1  # the lowest mantissa bit of one element
    return type(q)(bits.view(q._data.dtype), q._scale, q.block, q._orig_dtype)


def _double_one_scale(q):
    s = q._scale.float().clone()
    s.view(-1)[0] *= 2
    return type(q)(q._data, s.to(q._scale.dtype), q.block, q._orig_dtype)


@pytest.mark.parametrize("recipe,mutate,value,words", [
    (Current(), _flip_one_code, 1, "1 element(s) off the oracle"),
    (MX(elem="e4m3"), _double_one_scale, 0, "1 of 64 block scales differ")])
def test_a_planted_cast_fault_fails_its_row(monkeypatch, recipe, mutate, value, words):
    real = check_casts._cast_fn
    monkeypatch.setattr(check_casts, "_cast_fn", lambda backend, api: (
        lambda x, r, role, st: mutate(real(backend, api)(x, r, role, st))))
    r = check_casts._run_case("planted", recipe, "input", "fp8", "torch", torch.randn(8, 256), "random",
                              torch.float32, AuditConfig(backends=("torch",)), {})
    assert not r.passed and r.value == value and words in r.detail


@pytest.mark.parametrize("fault,words", [
    (lambda out: out * (1 + 2.0 ** -10), "codes"),
    (lambda out: torch.nan_to_num(out, nan=0.0), "NaN at 0 position(s) that must be finite, missing at")])
def test_a_gemm_off_by_more_than_its_bound_or_dropping_nan_fails(monkeypatch, fault, words):
    real = lowbit.kernels.scaled_mm
    monkeypatch.setattr(lowbit.kernels, "scaled_mm", lambda *a, **k: fault(real(*a, **k)))
    r = check_gemm._run_case("fp8-current", Current(), "input", False, False, "torch", "adversarial",
                             16, 48, 256, torch.float32, AuditConfig(backends=("torch",)))
    assert not r.passed and r.value > 1 and words in r.detail


@pytest.fixture(scope="module")
def attention_ref():
    return check_attention.references_for(check_attention.QUICK[0])


@pytest.mark.parametrize("fault,part,words", [
    (lambda grads: (grads[0] * 1.1, *grads[1:]), "fp8 dq", "rel L2"),
    (lambda grads: (grads[0], grads[1].index_fill(2, torch.tensor([3]), float("nan")), grads[2]), "fp8 dk",
     "non-finite values")])
def test_an_attention_gradient_off_by_10_percent_or_holding_a_nan_fails_its_row(monkeypatch, attention_ref, fault,
                                                                                 part, words):
    real = lowbit.kernels.attention.attention_backward
    monkeypatch.setattr(lowbit.kernels.attention, "attention_backward", lambda *a, **k: fault(real(*a, **k)))
    rows = check_attention.run_case(check_attention.QUICK[0], "torch", AuditConfig(backends=("torch",)),
                                    attention_ref)
    bad = [r for r in rows if not r.passed]
    assert [r.format for r in bad] == [part] and bad[0].value > 1 and words in bad[0].detail
    assert all(0 < r.value <= 1 for r in rows if r.passed)


def test_an_attention_kernel_that_raises_fails_its_four_rows(monkeypatch, attention_ref):
    def boom(*args, **kwargs):
        raise RuntimeError("boom")
    monkeypatch.setattr(lowbit.kernels.attention, "attention_forward", boom)
    rows = check_attention.run_case(check_attention.QUICK[0], "torch", AuditConfig(backends=("torch",)),
                                    attention_ref)
    assert len(rows) == 4 and not any(r.passed for r in rows) and all("RuntimeError: boom" in r.detail for r in rows)


def test_a_float64_reference_that_disagrees_with_mpmath_fails_the_attention_rows(monkeypatch):
    real = check_attention.references.attention
    monkeypatch.setattr(check_attention.references, "attention", lambda *a, **k: real(*a, **k) * (1 + 1e-9))
    monkeypatch.setattr(check_attention, "QUICK", check_attention.QUICK[:1])
    rows = check_attention.run(AuditConfig(backends=("torch",)))
    assert len(rows) == 4 and all(not r.passed and "disagrees with the mpmath reference" in r.detail for r in rows)


def test_a_failing_check_gives_exit_1_and_a_fail_line(monkeypatch, capsys):
    bad = CheckResult("planted", "torch", "e4m3", "1x1", "random", "max ULP", 3.0, 0.0, False, "planted fault")
    good = CheckResult("planted", "torch", "e4m3", "1x1", "random", "bound ratio", 0.5, 1.0, True)
    monkeypatch.setattr(AK, "CHECKS", (KernelCheck("planted", "a planted failure", lambda cfg: [good, bad]),))
    rc = main(["audit", "kernels", "--quick"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "2 checks on cpu (quick): 1 passed, 1 failed" in out
    assert "FAIL planted [torch] e4m3 1x1 random: planted fault" in out and "ratio 0.5" in out and "3 ULP" in out


def test_a_check_that_raises_is_a_failed_row(monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("boom")
    monkeypatch.setattr(lowbit.kernels, "scaled_mm", boom)
    r = check_gemm._run_case("fp8-current", Current(), "input", False, False, "torch", "random", 16, 48, 256,
                             torch.float32, AuditConfig(backends=("torch",)))
    assert not r.passed and r.value == math.inf and "RuntimeError: boom" in r.detail


def test_without_interpreter_the_command_reruns_itself_under_it(monkeypatch):
    seen = {}

    def fake_run(cmd, env):
        seen.update(cmd=cmd, env=env)
        return types.SimpleNamespace(returncode=7)
    monkeypatch.setattr("lowbit.kernels.triton.runtime.interpreting", lambda: False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("subprocess.run", fake_run)
    rc = run_audit_kernels(types.SimpleNamespace(quick=True, json=True))
    assert rc == 7 and seen["env"]["TRITON_INTERPRET"] == "1"
    assert seen["cmd"][1:] == ["-m", "lowbit.cli", "audit", "kernels", "--quick", "--json"]

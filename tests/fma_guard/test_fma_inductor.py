"""torch.compile: the Triton kernels inductor generates (for the CPU here) compiled for sm_90 and scanned."""
import torch

from lowbit.fma_guard import scan_inductor
from lowbit.fma_guard.scan import CANCEL, MAX


def scaled_softmax(x, s):
    qk = x * s
    e = torch.exp(qk - qk.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def scaled_softmax_safe(x, s):
    e = torch.exp((x - x.amax(-1, keepdim=True)) * s)
    return e / e.sum(-1, keepdim=True)


def variance_by_moments(x):
    return (x * x).mean(-1) - x.mean(-1) ** 2


def _findings(fn, *args):
    reports = scan_inductor(fn, *args)
    assert reports, "inductor generated no kernel"
    return [f for r in reports for f in r.findings]


def test_scaled_softmax_is_flagged_in_the_generated_kernel():
    found = _findings(scaled_softmax, torch.randn(8, 128), 0.125)
    assert [f.kind for f in found] == [MAX]
    f = found[0]
    assert f.path.endswith(".py") and "lowbit_fma_inductor" in f.path
    assert " - " in f.source_text  # the generated subtraction x*s - max(x*s)


def test_safe_softmax_is_clean():
    assert _findings(scaled_softmax_safe, torch.randn(8, 128), 0.125) == []


def test_variance_by_moments_is_flagged():
    assert [f.kind for f in _findings(variance_by_moments, torch.randn(8, 128))] == [CANCEL]

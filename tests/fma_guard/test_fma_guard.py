"""guard(), differential() and adversarial_scores() on the CPU.

On the CPU the guarded and differential launches run under TRITON_INTERPRET=1 (numpy never
contracts, so fused and unfused agree and the exponent arguments stay <= 0): this checks the
plumbing and the inputs; the fused-vs-unfused numbers come from benchmarks/fma_guard_gpu.py.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from fma_fixtures import load_fixture
from lowbit.fma_guard import adversarial_scores, differential, guard

SCALE = 0.18033688
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_guard_launches_with_fusion_off():
    calls = []

    class FakeKernel:
        def __getitem__(self, grid):
            return lambda *a, **kw: calls.append((grid, a, kw))

    g = guard(FakeKernel())
    g[(3,)](1, 2, BLOCK=4)
    assert calls == [((3,), (1, 2), {"BLOCK": 4, "enable_fp_fusion": False})]
    with pytest.raises(ValueError, match="guarded"):
        g[(3,)](1, enable_fp_fusion=True)
    with pytest.raises(TypeError, match=r"kernel\[grid\]"):
        g(1, 2)
    assert guard(g) is g
    with pytest.raises(TypeError):
        guard(42)


def test_guarded_scan_is_clean_where_the_plain_one_is_not():
    sm = load_fixture("online_softmax", tag="_guard")
    k = sm.online_softmax_exp_inside
    from lowbit.fma_guard import scan
    assert scan(k, sm.SIGNATURE, sm.CONSTEXPRS).findings
    assert guard(k).scan(sm.SIGNATURE, sm.CONSTEXPRS).clean


def test_guarded_run_and_differential_under_the_interpreter():
    """In a fresh process with TRITON_INTERPRET=1: the guarded softmax matches the exp2 reference
    with its largest exponent argument exactly 0, and the differential run reports both outputs,
    no difference (numpy never contracts), no positive argument, and leaves the caller's buffers alone."""
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, os.path.join(HERE, "interp_checks.py")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["guard_max_rel_err"] < 1e-5 and out["guard_max_arg"] == 0.0
    assert out["diff_outputs"] == [["P", 0, 4 * 512, 0, 0], ["ARG", 0, 4 * 512, 0, 0]]
    assert out["diff_probes"] == [["positive exponent args", 0.0, 0.0]]
    assert out["caller_buffers_untouched"] and "fused vs unfused" in out["format"]


def test_differential_refuses_cpu_tensors_without_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    sm = load_fixture("online_softmax", tag="_nointerp")
    x = torch.zeros(2, 256)
    with pytest.raises(RuntimeError, match="CUDA"):
        differential(sm.online_softmax_exp2_before, [x, x.clone(), x.clone(), SCALE, 256], (2,),
                     constexprs={"BLOCK": 256})
    with pytest.raises(ValueError, match="not tensor"):
        differential(sm.online_softmax_exp2_before, [x, x.clone(), x.clone(), SCALE, 256], (2,),
                     constexprs={"BLOCK": 256}, outputs=["s"])


@pytest.mark.parametrize("scale,magnitude", [(SCALE, 8.0), (0.0883883, 20.0), (1.3, 3.0)])
def test_adversarial_scores_round_down_at_the_row_max(scale, magnitude):
    x = adversarial_scores(64, 300, scale, magnitude=magnitude, seed=0)
    assert x.dtype == torch.float32 and x.shape == (64, 300)
    s = np.float32(scale)
    xm = x.max(dim=1).values.numpy()
    assert ((x.numpy() == xm[:, None]).sum(axis=1) == 1).all()      # a unique row max
    p = xm.astype(np.float64) * np.float64(s)                        # exact product
    r = (xm * s).astype(np.float64)                                  # fp32 product, correctly rounded
    ulp = np.spacing(r.astype(np.float32)).astype(np.float64)
    assert ((p - r) >= 0.25 * ulp).all()                             # fma(x, s, -r) > 0 by >= ulp/4


def test_adversarial_scores_bad_input():
    with pytest.raises(ValueError):
        adversarial_scores(0, 10, SCALE)
    with pytest.raises(ValueError):
        adversarial_scores(4, 10, -1.0)

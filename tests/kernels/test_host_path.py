"""The one-pass host path of a converted Linear (``lowbit.kernels.triton``: plans cached per call
shape, ``runtime.Launch``): a property of the code, not a timing. One forward + backward of an FP8
(delayed scaling) Linear on the Triton backend, with every kernel launch replaced by a recording
stub, after a warm-up step (the plans made), is profiled with ``sys.setprofile``:

* no plan is made (the plan caches do not grow), no ``nn.Module`` and no dataclass (recipe,
  Block) is constructed, the recipe string is never decoded, nothing is imported;
* 9 launches: per cast (x and w with their transposed copies, then g) the tensorwise one-read cast
  and the delayed-state update; the forward GEMM, dgrad and wgrad;
* at most ``CALL_BOUND`` Python function calls in all: each cast's plan lookup, allocations and
  FP8Tensor pair, each GEMM's plan lookup and run, the autograd glue. The per-call planning
  it replaces made two to three times as many on this path (every launch geometry recomputed
  through a dozen policy functions, three support checks a GEMM, a state module built per role).
"""
import dataclasses
import sys

import torch

import lowbit
from lowbit.kernels import BACKENDS
from lowbit.kernels.triton import make_backend
from lowbit.kernels.triton.runtime import Launch
from lowbit.scaling.recipes import Delayed

CALL_BOUND = 320


def test_converted_linear_step_is_one_pass(monkeypatch):
    be = dataclasses.replace(make_backend(name="triton-host-test", priority=-1), devices=("cpu",))
    BACKENDS.register(be)
    try:
        launches = []
        monkeypatch.setattr(Launch, "__call__", lambda self, *args: launches.append(self))
        layer = lowbit.nn.Linear.from_float(torch.nn.Linear(256, 128).to(torch.bfloat16), Delayed(),
                                            backend=be.name)
        x = torch.randn(64, 256, dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn(64, 128, dtype=torch.bfloat16)

        def step():
            layer(x).backward(g)
        step()
        step()
        kernels = be.plan.__self__
        caches = (kernels.fp8_casts._plans.plans, kernels.fp8_gemm._plans)
        sizes = [len(c) for c in caches]
        launches.clear()
        calls, names = [0], []

        def prof(frame, event, arg):
            if event == "call":
                calls[0] += 1
                code = frame.f_code
                names.append((code.co_filename, code.co_name, frame.f_locals.get("self")))
        sys.setprofile(prof)
        try:
            step()
        finally:
            sys.setprofile(None)
        assert [len(c) for c in caches] == sizes  # no new plan
        assert len(launches) == 9, [type(lch.kernel).__name__ for lch in launches]
        assert not [n for n in names if n[1] == "__init__" and isinstance(n[2], torch.nn.Module)]
        assert not [n for n in names if n[1] == "__init__" and n[0] == "<string>"]  # dataclass constructors
        assert not [n for n in names if (n[1] == "decode" and n[0].endswith("spec.py")) or "importlib" in n[0]]
        assert calls[0] <= CALL_BOUND, calls[0]
    finally:
        BACKENDS.backends.pop(be.name)

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

import pytest
import torch

import lowbit
from lowbit.dtypes.philox import Philox
from lowbit.kernels import BACKENDS
from lowbit.kernels.triton import make_backend
from lowbit.kernels.triton.runtime import Launch
from lowbit.scaling.recipes import MX, NV, Blockwise, Current, Delayed, Rowwise

CALL_BOUND = 320
# NV-FP4 also makes its stochastic-rounding draws a step, applies the Hadamard signs to the wgrad
# operands and carries its saved operands as (codes, block scales, tensor scale) triples
FP4_CALL_BOUND = 380


def _profiled_step(recipe, monkeypatch):
    """(launches, calls, names, plan cache sizes before/after) of the third step of a converted
    Linear on a CPU-registered Triton backend whose launches are recorded, not run."""
    be = dataclasses.replace(make_backend(name="triton-host-test", priority=-1), devices=("cpu",))
    BACKENDS.register(be)
    try:
        launches = []
        monkeypatch.setattr(Launch, "__call__", lambda self, *args: launches.append(self))
        layer = lowbit.nn.Linear.from_float(torch.nn.Linear(256, 128).to(torch.bfloat16), recipe, backend=be.name)
        x = torch.randn(64, 256, dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn(64, 128, dtype=torch.bfloat16)

        def step():
            layer(x).backward(g)
        step()
        step()
        kernels = be.plan.__self__
        caches = (kernels.fp8_casts._plans.plans, kernels.fp8_gemm._plans, kernels.fp4_casts._plans.plans)
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
        return launches, calls[0], names, sizes, [len(c) for c in caches]
    finally:
        BACKENDS.backends.pop(be.name)


def _no_construction_decoding_or_import(names):
    assert not [n for n in names if n[1] == "__init__" and isinstance(n[2], torch.nn.Module)]
    # dataclass constructors (recipes, blocks), but the step's two stochastic-rounding draw handles
    # (``Philox``: a tensor and a stream, made by design per backward)
    assert not [n for n in names if n[1] == "__init__" and n[0] == "<string>" and not isinstance(n[2], Philox)]
    assert not [n for n in names if (n[1] == "decode" and n[0].endswith("spec.py")) or "importlib" in n[0]]


def test_converted_linear_step_is_one_pass(monkeypatch):
    launches, calls, names, before, after = _profiled_step(Delayed(), monkeypatch)
    assert after == before  # no new plan
    assert len(launches) == 9, [type(lch.kernel).__name__ for lch in launches]
    _no_construction_decoding_or_import(names)
    assert calls <= CALL_BOUND, calls


@pytest.mark.parametrize("recipe", [Current(), Rowwise(), Blockwise(), MX(), NV()], ids=lambda r: type(r).__name__)
def test_every_recipe_step_plans_once(recipe, monkeypatch):
    """Every other recipe's eager step (FP4: the layer's recipe object handed to the ops) makes no
    plan, builds no module or dataclass (blocks and their transposes are built with the recipe),
    decodes and imports nothing, within the same call bound."""
    launches, calls, names, before, after = _profiled_step(recipe, monkeypatch)
    assert after == before and launches
    _no_construction_decoding_or_import(names)
    assert calls <= (FP4_CALL_BOUND if recipe.kind == "fp4" else CALL_BOUND), calls

"""torch.compile with inductor (C++ on the CPU): the hooks, the backward taps and the record op
trace into one graph (fullgraph=True raises on a graph break; one frame compiled), the records run
inside the compiled forward and backward, and a NaN made in one module's backward is still found,
named and stepped exactly. Attaching to a compiled model that already ran retraces it (Dynamo
does not guard on module hooks)."""
import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import lowbit

from planted import PlantedSiLU


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), PlantedSiLU(), nn.Linear(16, 4))


def _run(f, m, mon, steps=3, bad=1):
    for s in range(steps):
        m[1].gain.fill_(float("nan") if s == bad else 1.0)
        f(torch.randn(2, 8)).sum().backward()
        mon.step()
    return mon.first_nonfinite


def test_nan_planted_in_a_compiled_backward_is_found_without_graph_break():
    import torch._inductor.config as cfg
    torch._dynamo.reset()
    # no compile worker pool: a few kernels compile faster in-process. The vector ISA is left alone:
    # turning it off here left later inductor builds in the run with vectorised code and no vector headers.
    with cfg.patch(compile_threads=1):
        _planted_backward_found()


def _planted_backward_found():
    m = _model()
    cnt = CompileCounterWithBackend("inductor")
    f = torch.compile(m, backend=cnt, fullgraph=True)
    mon = lowbit.monitor(f, on_anomaly="record")  # the compiled wrapper: watched through the model
    assert mon.model is m and "0" in mon.layout.modules
    first = _run(f, m, mon)
    assert (first.module, first.phase, first.step, first.tensor) == ("1", "backward", 1, "grad_input")
    assert cnt.frame_count == 1  # one trace for the three steps: nothing recompiles per step
    row = mon.layout.slot("0", "forward", "output")
    assert mon.totals.seen[row] and mon.totals.amax[row] > 0  # the compiled forward recorded too
    mon.detach()


def test_attaching_to_a_compiled_model_that_already_ran_retraces_it():
    torch._dynamo.reset()
    m = _model()
    cnt = CompileCounterWithBackend("aot_eager")
    f = torch.compile(m, backend=cnt, fullgraph=True)
    f(torch.randn(2, 8)).sum().backward()  # traced without hooks
    mon = lowbit.monitor(f, on_anomaly="record")  # Dynamo does not guard on hooks: the monitor retraces
    first = _run(f, m, mon, steps=2)
    assert (first.module, first.phase, first.step) == ("1", "backward", 1) and cnt.frame_count == 2
    mon.detach()


def test_a_watched_hugging_face_llama_compiles_without_graph_break_or_recompile():
    """fullgraph=True raises on a graph break; the root module's own hooks run outside its compiled
    forward (torch.compile of a module with hooks: they are frames of their own)."""
    from planted import batches, tiny_llama
    torch._dynamo.reset()
    model = tiny_llama()
    cnt = CompileCounterWithBackend("eager")
    with lowbit.monitor(model, on_anomaly="record") as mon:
        f = torch.compile(model, backend=cnt, fullgraph=True)
        frames = []
        for ids in batches(2):
            f(input_ids=ids, labels=ids).loss.backward()
            mon.step()
            frames.append(cnt.frame_count)
        assert mon.events == [] and frames[0] == frames[1] <= 3
        row = mon.layout.slot("model.layers.0.mlp.down_proj", "backward", "grad_input")
        assert mon.totals.seen[row]  # the backward taps ran

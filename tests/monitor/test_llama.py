"""The acceptance faults on a tiny Hugging Face Llama: a NaN in a weight, a NaN made in another
module's backward, a 1e4x spike into a delayed-scaled layer; the JSON lines, SQNR and the replay."""
import json
import math
import warnings

import pytest
import torch

import lowbit
from lowbit.cli import main
from lowbit.monitor import Event
from lowbit.monitor.flight import replay

from planted import PlantedSiLU, batches, tiny_llama, train

pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e .[test])")


def test_nan_in_a_weight_is_named_with_its_step_logged_and_replayed(tmp_path, capsys):
    model = tiny_llama()
    k, s = "model.layers.0.mlp.up_proj", 1
    target = dict(model.named_modules())[k]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    log, flight = tmp_path / "numerics.jsonl", tmp_path / "flight.pt"
    mon = lowbit.monitor(model, log=str(log), on_anomaly="record", optimizer=opt, flight=str(flight))

    def plant(i):
        if i == s:
            with torch.no_grad():
                target.weight[5, 7] = float("nan")
    train(model, batches(3), mon, plant, opt)
    assert mon.first_nonfinite == Event("nonfinite", s, k, "forward", "weight", 1.0)
    assert mon.steps == 3 and not [e for e in mon.events if e.kind == "nonfinite" and e.step < s]
    # the NaN flowed on: its consumers saw it, but none of them is the culprit
    assert any(e.module == "model.layers.0.mlp.down_proj" and e.tensor == "input" for e in mon.events)
    mon.detach()

    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2]
    assert lines[s]["culprit"] == {"kind": "nonfinite", "step": s, "module": k, "phase": "forward",
                                   "tensor": "weight", "value": 1.0}
    assert lines[s]["modules"][k]["forward"]["weight"]["nonfinite"] == 1
    assert lines[s - 1]["modules"][k]["forward"]["output"]["nonfinite"] == 0
    assert lines[s]["modules"][k]["forward"]["output"]["numel"] == 2 * 8 * 64

    text = replay(str(flight))
    assert f"step {s}, nonfinite in {k} forward weight" in text and "before the optimizer step" in text
    assert "1 non-finite at [5, 7]=nan" in text  # the planted element, the only one
    assert "non-finite in both runs" in text and "the data, not the precision" in text
    assert "reproduced: yes" in text
    assert main(["replay", str(flight)]) == 0
    assert "reproduced: yes" in capsys.readouterr().out


def test_nan_made_in_a_backward_names_that_module_not_the_ones_it_flows_into(tmp_path):
    model = tiny_llama()
    k, t = "model.layers.0.mlp.act_fn", 1
    act = PlantedSiLU()
    model.model.layers[0].mlp.act_fn = act
    flight = tmp_path / "flight.pt"
    with lowbit.monitor(model, on_anomaly="record", flight=str(flight)) as mon:
        train(model, batches(2), mon, lambda i: act.gain.fill_(float("nan") if i == t else 1.0))
        first = mon.first_nonfinite
        events = mon.events
    assert (first.kind, first.module, first.phase, first.step, first.tensor) == \
        ("nonfinite", k, "backward", t, "grad_input")
    assert not [e for e in events if e.kind == "nonfinite" and e.phase == "forward" and e.step <= t]
    # upstream of the act_fn the gradients are non-finite too, downstream (its grad_output) not
    bad = {(e.module, e.tensor) for e in events if e.kind == "nonfinite" and e.step == t}
    assert ("model.layers.0.mlp.gate_proj", "grad_output") in bad and (k, "grad_output") not in bad
    text = replay(str(flight))  # the forward again, then the backward from the recorded output gradient
    assert "output gradients:" in text and "grad_output 0: float32 (2, 8, 64)" in text
    assert "grad of input 0: 1024 non-finite in the format" in text and "reproduced: yes" in text


def test_activation_spike_into_a_delayed_scaled_layer_is_an_overflow_of_its_input(tmp_path):
    model = tiny_llama()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the output head stays in high precision
        lowbit.convert(model, "fp8")
    k, u = "model.layers.0.mlp.down_proj", 2
    layer = dict(model.named_modules())[k]
    spike = {"on": False}
    layer.register_forward_pre_hook(lambda m, args: (args[0] * 1e4,) if spike["on"] else None)
    log = tmp_path / "n.jsonl"
    with lowbit.monitor(model, on_anomaly="record", log=str(log), sqnr_every=2) as mon:
        train(model, batches(3), mon, lambda i: spike.update(on=i == u))
        events = mon.events
    over = [e for e in events if e.kind == "overflow" and e.module == k and e.tensor == "input" and e.value > 0.5]
    assert [(e.step, e.phase) for e in over] == [(u, "forward")]
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    fig = lines[u]["modules"][k]["forward"]["input"]
    assert fig["fmt"] == "e4m3" and fig["amax_ratio"] > 100 and fig["saturated"] > 0.5
    assert lines[u - 1]["modules"][k]["forward"]["input"]["amax_ratio"] <= 2
    # SQNR every 2 steps, and E4M3 round-to-nearest keeps it above 20 log10(2^4) dB without saturation
    q = "model.layers.0.self_attn.q_proj"
    assert [("sqnr_db" in x["modules"][q]["forward"]["input"]) for x in lines] == [True, False, True]
    assert all(x["modules"][q]["forward"]["input"]["sqnr_db"] > 20 * math.log10(16) for x in lines[::2])

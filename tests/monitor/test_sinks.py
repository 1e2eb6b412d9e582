"""Sinks: the PNG of ``lowbit monitor plot``, the TensorBoard scalars (through a stand-in writer:
the tags and values the monitor hands it), and a clear error without TensorBoard."""
import json
import sys
import types

import pytest
import torch
from torch import nn

import lowbit
from lowbit.cli import main


def _fp8_run(log, steps=3):
    torch.manual_seed(0)
    m = lowbit.convert(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)), "fp8",
                       filter=lambda n, mod: True)
    with lowbit.monitor(m, log=log, on_anomaly="record") as mon:
        for s in range(steps):
            x = torch.randn(8, 16) * (1e4 if s == steps - 1 else 1.0)
            m(x).square().mean().backward()
            mon.step()
    return mon


def test_monitor_plot_writes_a_png_of_the_casts(tmp_path, capsys):
    log = tmp_path / "n.jsonl"
    _fp8_run(str(log))
    assert main(["monitor", "plot", str(log)]) == 0
    png = (tmp_path / "n.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert f"wrote {tmp_path / 'n.png'}" in capsys.readouterr().out


class _Writer:
    def __init__(self, logdir):
        self.logdir, self.scalars, self.texts, self.closed = logdir, {}, [], False

    def add_scalar(self, tag, value, step):
        self.scalars[(tag, step)] = value

    def add_text(self, tag, text, step):
        self.texts.append((tag, text, step))

    def close(self):
        self.closed = True


def test_tensorboard_sink_writes_each_figure_and_event(monkeypatch, tmp_path):
    made = []
    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = lambda logdir: made.append(_Writer(logdir)) or made[-1]
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    log = tmp_path / "n.jsonl"
    _fp8_run(["tb:" + str(tmp_path / "tb"), str(log)])
    (w,) = made
    assert w.logdir == str(tmp_path / "tb") and w.closed
    last = json.loads(log.read_text().splitlines()[-1])
    fig = last["modules"]["0"]["forward"]["input"]
    for k in ("amax", "saturated", "underflow", "scale", "amax_ratio", "nonfinite"):
        assert w.scalars[(f"0/forward.input/{k}", 2)] == pytest.approx(fig[k])
    assert any("overflow in 0 forward input" in t for _, t, s in w.texts if s == 2)


def test_tensorboard_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ImportError, match="pip install tensorboard"):
        lowbit.monitor(nn.Linear(2, 2), log="tb:runs")


def test_demo_with_monitor_logs_every_run_and_reports(tmp_path):
    from lowbit.cli import build_parser
    from lowbit.demo import DemoConfig, run_demo
    assert build_parser().parse_args(["demo", "--monitor"]).monitor is True
    res = run_demo(DemoConfig(formats=("fp8",), steps=3, batch=2, progress=False, corpus_bytes=50_000,
                              val_batches=1, monitor=str(tmp_path)))
    for run in res["runs"]:
        lines = [json.loads(x) for x in (tmp_path / f"monitor_{run['format']}_seed0.jsonl").read_text().splitlines()]
        assert [x["step"] for x in lines] == [0, 1, 2]
        assert run["monitor"]["first_nonfinite"] == "" and "3 monitored step(s)" in run["monitor"]["report"]
    fp8 = lines[-1]["modules"]["blocks.0.fc"]["forward"]["input"]
    assert fp8["fmt"] == "e4m3" and fp8["nonfinite"] == 0
    json.dumps(res)

"""What users hand the monitor: models without parameters, modules returning tuples, dicts,
dataclasses, ModelOutput or ints, in-place ops on tapped tensors, attach and detach twice, bad
arguments. Handled with a clear error or a documented behaviour, never a crash inside a hook;
no hook syncs the host, and no recorded tensor outlives its step."""
import dataclasses
import json

import pytest
import torch
from torch import nn

import lowbit
from lowbit.monitor import Event, Monitor, NumericsError, Thresholds


class Pairs(nn.Module):
    """Returns a tuple, a dict, a dataclass, ints and None."""

    @dataclasses.dataclass
    class Out:
        y: torch.Tensor
        n: int = 3

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, scale=None):
        y = self.lin(x)
        return (y, {"z": y * 2, "idx": y.argmax(-1), "none": None}, self.Out(y + 1), 7)


class NoParams(nn.Module):
    def forward(self, x):
        return torch.log(x)  # log of a negative number: NaN made here


def _loss(out):
    y, d, o, _ = out
    return y.sum() + d["z"].sum() + o.y.sum()


def test_containers_ints_and_kwargs_are_walked_and_tapped():
    m = Pairs()
    mon = lowbit.monitor(m, on_anomaly="record")
    out = m(torch.randn(3, 4, requires_grad=True), scale=torch.ones(1))
    assert out[1]["idx"].dtype == torch.int64 and out[3] == 7 and isinstance(out[2], Pairs.Out)
    _loss(out).backward()
    mon.step()
    mon.flush()  # steps are read lazily: at the next step, or on flush / events / report
    rec = mon.totals
    for name, phase, tensor in (("", "forward", "output"), ("", "backward", "grad_output"),
                                ("", "backward", "grad_input"), ("lin", "backward", "weight")):
        assert rec.seen[mon.layout.slot(name, phase, tensor)], (name, phase, tensor)
    # finite outputs: the inputs and parameters behind them are not read (only aliases noted)
    assert not rec.seen[mon.layout.slot("lin", "forward", "weight")]
    assert mon.events == [] and mon.first_nonfinite is None
    mon.detach()
    mon.detach()  # twice: nothing
    with pytest.raises(RuntimeError, match="after detach"):
        mon.step()


def test_model_without_parameters_and_two_monitors_on_one_model():
    m = nn.Sequential(NoParams(), nn.ReLU(inplace=True))  # in place on the tapped output
    a = lowbit.monitor(m, on_anomaly="record")
    b = lowbit.monitor(m, on_anomaly="record")
    x = torch.tensor([[1.0, -1.0, 2.0]], requires_grad=True)
    m(x).sum().backward()
    a.step()
    b.step()
    for mon in (a, b):  # both see it, independently
        assert mon.first_nonfinite == Event("nonfinite", 0, "0", "forward", "output", 1.0)
    a.detach()
    m(x).sum().backward()
    b.step()
    assert b.steps == 2 and a.steps == 1
    b.detach()


def test_on_anomaly_raise_warn_and_callable():
    m = nn.Sequential(NoParams())
    x = -torch.ones(2)
    with lowbit.monitor(m, on_anomaly="raise") as mon:
        m(x)
        with pytest.raises(NumericsError) as err:
            mon.step()
    assert err.value.event.module == "0" and err.value.event.step == 0
    seen = []
    with lowbit.monitor(m, on_anomaly=seen.append):
        pass
    with lowbit.monitor(m, on_anomaly=seen.append) as mon:
        m(x)
        mon.step()
        mon.flush()
    assert seen and all(isinstance(e, Event) for e in seen)
    with lowbit.monitor(m) as mon:
        with pytest.warns(RuntimeWarning, match="first non-finite values made here"):
            for _ in range(3):
                m(x)
                mon.step()
            mon.flush()


@pytest.mark.parametrize("kwargs,err", [
    (dict(every=0), ValueError), (dict(every=1.5), ValueError), (dict(on_anomaly="explode"), ValueError),
    (dict(optimizer=object()), TypeError), (dict(log=3), TypeError), (dict(thresholds=0.1), TypeError),
    (dict(sqnr_every=-1), ValueError)])
def test_bad_arguments_are_clear_errors(kwargs, err):
    with pytest.raises(err, match="lowbit.monitor|log="):
        lowbit.monitor(nn.Linear(2, 2), **kwargs)
    with pytest.raises(TypeError, match="nn.Module"):
        lowbit.monitor(lambda x: x)


def test_no_hook_syncs_the_host(monkeypatch, tmp_path):
    """Every way a tensor reaches the host raises during forward and backward; the monitor's
    hooks, taps and records (fp8 layers included) run through."""
    torch.manual_seed(0)
    m = lowbit.convert(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 16)), "fp8",
                       filter=lambda n, mod: True)
    mon = lowbit.monitor(m, on_anomaly="record", log=str(tmp_path / "n.jsonl"), sqnr_every=1)
    assert isinstance(mon, Monitor) and callable(lowbit.monitor) and lowbit.monitor.Thresholds is Thresholds

    def boom(*a, **k):
        raise AssertionError("host sync inside a step")
    for step in range(2):
        x = torch.randn(4, 16, requires_grad=True)
        with monkeypatch.context() as mp:
            for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__"):
                mp.setattr(torch.Tensor, name, boom)
            loss = m(x).square().mean()
            loss.backward()
        mon.step()
    mon.detach()
    line = json.loads((tmp_path / "n.jsonl").read_text().splitlines()[-1])
    assert line["modules"]["0"]["forward"]["input"]["sqnr_db"] > 24  # E4M3: 20 log10(2^4) dB at least


def test_every_n_monitors_steps_0_n_2n(tmp_path):
    m = nn.Sequential(NoParams())
    log = tmp_path / "n.jsonl"
    with lowbit.monitor(m, every=2, log=str(log), on_anomaly="record") as mon:
        for s in range(4):
            m(-torch.ones(2) if s in (1, 2) else torch.ones(2))  # NaN at steps 1 (not watched) and 2
            mon.step()
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [0, 2]
    assert mon.first_nonfinite.step == 2


@pytest.mark.parametrize("fmt", ["fp8", "fp8-block", "nvfp4"])
def test_recorded_tensors_are_not_kept_after_the_step(fmt):
    """A monitored training step of a converted model leaves nothing of its tensors behind: the
    input, the activations and the gradients the casts' rows read are freed with the step."""
    import gc

    from torch.multiprocessing.reductions import StorageWeakRef
    torch.manual_seed(0)
    m = lowbit.convert(nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64)), fmt,
                       filter=lambda n, mod: True)
    with lowbit.monitor(m, on_anomaly="record") as mon:
        refs = []
        for _ in range(3):
            x = torch.randn(32, 64, requires_grad=True)
            y = m(x)
            y.square().mean().backward()
            refs += [StorageWeakRef(t.untyped_storage()) for t in (x, y, x.grad)]
            del x, y
            mon.step()
        gc.collect()
        assert [r.expired() for r in refs] == [True] * len(refs)  # (memory, not just the Python objects)
        assert mon.steps == 3

"""The ``lowbit`` command as a first user meets it (through ``lowbit.cli.main`` and capsys): every
bad command line is one line on stderr naming the bad value and the choices, exit status 2; the
demo says what it compares (the baseline and why), where it writes, and a one-seed gap only to
the precision one seed supports. Training itself is stubbed here (``tests/demo`` runs it)."""
import os

import torch

import lowbit.demo.train as demo_train
from lowbit.cli import main
from lowbit.convert import FORMATS


def _status(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's way out
        return e.code


def _one_line_error(capsys, argv, *parts):
    rc = _status(argv)
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in cap.err + cap.out, (rc, cap.err)
    for p in parts:
        assert p in lines[0], (p, lines[0])
    return lines[0]


def test_bad_values_are_one_line_naming_the_value_and_the_choices(capsys, tmp_path):
    _one_line_error(capsys, ["demo", "--formats", "fp8,fp9"], "lowbit demo: error:", "'fp9'", *FORMATS)
    _one_line_error(capsys, ["demo", "--size", "huge"], "'huge'", "tiny", "small", "50m")
    _one_line_error(capsys, ["demo", "--baseline", "fp16"], "'fp16'", "bf16", "fp32")
    _one_line_error(capsys, ["demo", "--backend", "nope"], "'nope'", "auto", "torch")
    _one_line_error(capsys, ["demo", "--steps", "0"], "--steps", "'0'", "positive")
    _one_line_error(capsys, ["demo", "--device", "gpu"], "--device", "'gpu'", "choose from cpu")
    _one_line_error(capsys, ["nope"], "'nope'", "formats", "demo", "audit")
    blocker = tmp_path / "file"
    blocker.write_text("")
    _one_line_error(capsys, ["demo", "--out", str(blocker / "sub")], "--out", str(blocker / "sub"))


def test_demo_on_cuda_without_cuda_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _one_line_error(capsys, ["demo", "--device", "cuda"], "'cuda'", "CUDA is not available", "cpu")


def _fake_run_demo(calls):
    def run_demo(cfg, on_result=None):
        cfg = cfg.resolved()
        calls.append(cfg)
        runs = [{"format": f, "losses": [3.0, 2.5, 2.2], "final_loss": loss, "val_loss": loss, "tokens_per_s": 1e3,
                 "peak_mem_mb": None, "converted_layers": 8, "error": None}
                for f, loss in ((cfg.baseline, 2.0), *((f, 2.0 * 1.002735) for f in cfg.formats))]
        for r in runs:
            r["gap_pct"] = 100.0 * (r["final_loss"] - 2.0) / 2.0
        return {"config": {"formats": list(cfg.formats), "size": cfg.size, "steps": cfg.steps, "batch": cfg.batch,
                           "seq_len": 64, "seeds": cfg.seeds, "device": cfg.device, "baseline": cfg.baseline},
                "runs": runs}
    return run_demo


def test_demo_says_baseline_outputs_and_one_seed_precision(capsys, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(demo_train, "run_demo", _fake_run_demo(calls))
    assert main(["demo", "--device", "cpu", "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert calls[0].baseline == "fp32"
    head = out.splitlines()[0]
    assert "fp32" in head and "baseline" in head and "CPU" in head  # what is compared, and why fp32
    where = os.path.abspath(tmp_path / "o")
    assert os.path.join(where, "demo.json") in out and os.path.join(where, "demo_loss.png") in out
    assert os.path.isfile(os.path.join(where, "demo.json")) and os.path.isfile(os.path.join(where, "demo_loss.png"))
    row = next(line for line in out.splitlines() if line.startswith("fp8 "))
    assert "+0%" in row.split() and "0.27" not in out  # one seed: the whole percent, not +0.27%
    assert "one seed" in out


def test_demo_50m_on_the_cpu_warns_it_is_sized_for_a_gpu(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(demo_train, "run_demo", _fake_run_demo([]))
    assert main(["demo", "--size", "50m", "--device", "cpu", "--steps", "1", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "50m" in err and "GPU" in err
    main(["demo", "--size", "tiny", "--device", "cpu", "--steps", "1", "--out", str(tmp_path)])
    assert "GPU" not in capsys.readouterr().err

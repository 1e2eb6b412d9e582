"""lowbit demo: the corpus, the model, the runs (same data order, one row per format), the report
(table last, PNG with and without matplotlib) and the `lowbit demo` command."""
import builtins
import json
import struct
import zlib

import pytest
import torch

import lowbit
from lowbit.cli import main
from lowbit.convert import FORMATS
from lowbit.demo import DemoConfig, run_demo
from lowbit.demo.corpus import load_corpus, split
from lowbit.demo.model import GPT, SIZES
from lowbit.demo.report import paired_se_pct, plot, smooth, table


def test_corpus_is_python_source_and_deterministic():
    a, b = load_corpus(200_000), load_corpus(200_000)
    assert a.dtype == torch.uint8 and len(a) == 200_000 and torch.equal(a, b)
    text = bytes(a[:200_000].tolist()).decode("utf-8", errors="replace")
    assert "def " in text and "import " in text
    tr, va = split(a, 0.1)
    assert len(tr) + len(va) == len(a) and torch.equal(va, a[len(tr):])


@pytest.mark.parametrize("size", sorted(SIZES))
def test_model_sizes_and_every_format_converts_every_block_linear(size):
    c = SIZES[size]
    with torch.device("meta"):
        m = GPT(c)
    assert m.n_params() == 12 * c.n_layer * c.d_model ** 2 + 13 * c.n_layer * c.d_model + \
        (256 + c.seq_len) * c.d_model + 2 * c.d_model + c.d_model * 256
    if size == "50m":
        assert 45e6 < m.n_params() < 55e6
    for fmt in FORMATS:
        with torch.device("meta"):
            mm = GPT(c)
        with pytest.warns(UserWarning, match="lm_head: output head"):
            lowbit.convert(mm, fmt)
        assert sum(isinstance(x, lowbit.nn.LowbitModule) for x in mm.modules()) == 4 * c.n_layer


def test_run_demo_same_data_order_and_rows():
    res = run_demo(DemoConfig(formats=("fp8-current", "nvfp4"), steps=10, batch=4, progress=False,
                              corpus_bytes=100_000, val_batches=2))
    runs = {r["format"]: r for r in res["runs"]}
    assert list(runs) == ["fp32", "fp8-current", "nvfp4"] and res["config"]["baseline"] == "fp32"
    base = runs["fp32"]
    for name, r in runs.items():
        assert r["error"] is None and len(r["losses"]) == 10 and r["tokens_per_s"] > 0
        assert r["converted_layers"] == (0 if name == "fp32" else 8)
        # same initial weights and the same first batch: the first losses agree to quantization error
        assert abs(r["losses"][0] - base["losses"][0]) < 0.02 * base["losses"][0]
        assert sum(r["losses"][-3:]) / 3 < r["losses"][0] - 0.3  # it learns
        assert r["gap_pct"] == pytest.approx(100 * (r["final_loss"] - base["final_loss"]) / base["final_loss"])
    json.dumps(res)
    t = table(res)
    assert t.splitlines()[0].split()[:3] == ["format", "final", "loss"] and "nvfp4" in t and "gap vs fp32" in t


def test_run_demo_over_seeds_reports_means_and_spread():
    res = run_demo(DemoConfig(formats=("fp8",), steps=6, batch=2, seeds=2, seed=3, progress=False,
                              corpus_bytes=50_000, val_batches=1))
    base, fp8 = res["runs"]
    assert res["config"]["seeds"] == 2 and base["seeds"] == fp8["seeds"] == [3, 4]
    for r in (base, fp8):
        a, b = r["final_losses"]
        assert a != b  # another seed: other initial weights and batches
        assert r["final_loss"] == pytest.approx((a + b) / 2)
        assert r["final_std"] == pytest.approx(abs(a - b) / 2 ** 0.5)
        assert len(r["losses"]) == 6 and r["graph"] is False  # CPU: eager steps
    # seed s is the same for every format: the first losses agree to quantization error
    single = run_demo(DemoConfig(formats=(), steps=6, batch=2, seed=4, progress=False, corpus_bytes=50_000,
                                 val_batches=1))["runs"][0]
    assert single["final_loss"] == base["final_losses"][1]
    assert fp8["gap_pct"] == pytest.approx(100 * (fp8["final_loss"] - base["final_loss"]) / base["final_loss"])
    d = [f - b for f, b in zip(fp8["final_losses"], base["final_losses"])]
    assert paired_se_pct(fp8, base) == pytest.approx(100 * abs(d[0] - d[1]) / 2 / base["final_loss"])
    assert "+-" in table(res) and "mean of 2 seeds" in table(res)


def test_a_failing_format_is_reported_and_the_others_run(monkeypatch):
    import lowbit.demo.train as tr
    real = tr.train_one

    def flaky(fmt, *a):
        if fmt == "mxfp4":
            raise RuntimeError("boom")
        return real(fmt, *a)
    monkeypatch.setattr(tr, "train_one", flaky)
    res = tr.run_demo(DemoConfig(formats=("mxfp4", "fp8"), steps=4, batch=2, progress=False,
                                 corpus_bytes=50_000, val_batches=1))
    assert [r["format"] for r in res["runs"]] == ["fp32", "mxfp4", "fp8"]
    assert res["runs"][1]["error"] == "RuntimeError: boom" and res["runs"][2]["error"] is None
    assert "RuntimeError: boom" in table(res)


def _png_size(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24]), data


def test_builtin_png_writer_without_matplotlib(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_mpl(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib here")
        return real_import(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_mpl)
    res = {"config": {"size": "tiny", "device": "cpu"},
           "runs": [{"format": "fp32", "losses": [3.0 - 0.01 * i for i in range(100)]},
                    {"format": "fp8", "losses": [3.1 - 0.01 * i for i in range(100)], "gap_pct": 1.0}]}
    assert plot(res, str(tmp_path / "c.png")) == "builtin"
    (w, h), data = _png_size(tmp_path / "c.png")
    i = data.index(b"IDAT")
    n = struct.unpack(">I", data[i - 4:i])[0]
    raw = zlib.decompress(data[i + 4:i + 4 + n])
    assert len(raw) == h * (1 + 3 * w)
    assert raw.count(bytes((31, 119, 180))) > 100  # the fp8 curve is drawn in its colour


def test_smooth_is_a_trailing_mean():
    assert smooth([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


def test_cli_demo_writes_json_png_and_prints_table_last(tmp_path, capsys):
    rc = main(["demo", "--formats", "fp8", "--steps", "6", "--batch", "2", "--out", str(tmp_path), "--no-progress"])
    assert rc == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-4].startswith("format") and out[-3].startswith("fp32") and out[-2].startswith("fp8")
    assert "6 steps" in out[-1]
    res = json.load(open(tmp_path / "demo.json"))
    assert [r["format"] for r in res["runs"]] == ["fp32", "fp8"]
    _png_size(tmp_path / "demo_loss.png")


def test_bad_demo_input():
    with pytest.raises(ValueError, match="unknown format"):
        run_demo(DemoConfig(formats=("fp9",)))
    with pytest.raises(ValueError, match="unknown size"):
        run_demo(DemoConfig(size="huge"))
    with pytest.raises(SystemExit):
        main(["demo", "--size", "huge"])

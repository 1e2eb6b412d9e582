"""benchmarks/step.py on the CPU: the ``tiny`` HF Llama in eager mode, fp32 anchor and one lowbit
format, writes well-formed results.csv rows and a table in which both models train; and the
recorder of inductor's cudagraph skip reasons hears inductor's logger."""
import csv
import json
import math
import sys

import torch

from benchmarks import step
from benchmarks.common import RESULT_FIELDS


def test_tiny_eager_run_writes_well_formed_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["step.py", "--workloads", "tiny", "--formats", "fp8-current", "--modes",
                                      "eager", "--steps", "2", "--quick", "--device", "cpu", "--out", str(tmp_path)])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny steps: OpenMP threads only wait on each other
    try:
        step.main()
    finally:
        torch.set_num_threads(threads)
    with open(tmp_path / "results.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == RESULT_FIELDS
        rows = list(reader)
    shape = step.WORKLOADS["tiny"].shape
    for r in rows:
        assert r["workload"] == "tiny" and r["shape"] == shape and r["torch"] == torch.__version__, r
        assert math.isfinite(float(r["value"])), r
        if r["metric"] == "step_ms" and r["anchor"]:
            assert float(r["ratio"]) > 0, r
        else:
            assert r["ratio"] == "", r
    by = {(r["variant"], r["metric"], r["anchor"]): r for r in rows}
    assert set(by) >= {("fp32 eager", "step_ms", ""), ("lowbit fp8-current eager", "step_ms", ""),
                       ("lowbit fp8-current eager", "step_ms", "fp32"), ("lowbit fp8-current eager", "loss", ""),
                       ("lowbit fp8-current eager", "loss_rel_diff", "fp32")}
    ms = {v: float(by[(v, "step_ms", "")]["value"]) for v in ("fp32 eager", "lowbit fp8-current eager")}
    ratio = float(by[("lowbit fp8-current eager", "step_ms", "fp32")]["ratio"])
    assert math.isclose(ratio, ms["fp32 eager"] / ms["lowbit fp8-current eager"], rel_tol=1e-3)
    assert not any(r["metric"] == "peak_GiB" for r in rows)  # no CUDA allocator on the CPU
    table = json.loads((tmp_path / "step.json").read_text())["table"]
    assert [t["variant"] for t in table] == ["fp32", "fp8-current"] and not any("error" in t for t in table)
    n = 7 * step.WORKLOADS["tiny"].layers + 1  # q, k, v, o, gate, up, down per layer; the LM head
    assert [t["converted"] for t in table] == [f"0/{n}", f"{n - 1}/{n}"]  # the default filter keeps the head
    for t in table:  # both train: the loss after the timed steps is below the first step's
        assert t["loss"] < t["loss0"], t
    assert table[1]["loss_ok"] is True


def test_skip_recorder_hears_inductor_cudagraph_skips():
    from torch._inductor.cudagraph_utils import cudagraphs_log, log_cudagraph_skip_and_bump_counter
    rec = step.SkipRecorder().install()
    try:
        log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to cpu device (arg0_1)\n  stack")
        cudagraphs_log.warning("recording a graph")  # not a skip
    finally:
        rec.uninstall()
    assert rec.reasons == ["skipping cudagraphs due to cpu device (arg0_1)"]


def test_a_time_limit_keeps_the_rows_measured_so_far(tmp_path, monkeypatch):
    """SIGTERM (``timeout``) during the second variant: the first one's rows are still written."""
    import os
    import signal
    monkeypatch.setattr(sys, "argv", ["step.py", "--workloads", "tiny", "--formats", "fp8", "--modes", "eager",
                                      "--steps", "1", "--quick", "--device", "cpu", "--torchao", "",
                                      "--out", str(tmp_path)])
    real, calls = step.run_variant, []

    def run(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)
    monkeypatch.setattr(step, "run_variant", run)
    handler = signal.getsignal(signal.SIGTERM)
    step.main()
    assert calls == ["fp32", "fp8"] and signal.getsignal(signal.SIGTERM) is handler
    with open(tmp_path / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["variant"] for r in rows} == {"fp32 eager"} and any(r["metric"] == "step_ms" for r in rows)
    table = json.loads((tmp_path / "step.json").read_text())["table"]
    assert [t["variant"] for t in table] == ["fp32"]

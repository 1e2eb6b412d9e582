"""``lowbit.validate.audit_model`` / ``lowbit audit model``: the acceptance case (a 4-layer MLP whose
third layer holds four outliers 1e5x its typical weight), what the numbers mean, the JSON schema and
the exit codes."""
import json
import math
import os

import pytest
import torch

from lowbit.cli import main
from lowbit.scaling import MX
from lowbit.validate.model_audit import COARSE_TO_FINE, _saturation, audit_model
from mlp import make_batch, make_model

HERE = os.path.dirname(os.path.abspath(__file__))
MLP = os.path.join(HERE, "mlp.py")
FORMATS = ("fp8", "fp8-rowwise", "fp8-block")
KEYS = {"name", "format", "sqnr_db", "sqnr_worst_db", "sqnr_grad_input_db", "sqnr_grad_weight_db",
        "overflow", "underflow", "recommended"}


@pytest.fixture(scope="module")
def audit():
    return audit_model(make_model(), make_batch(), FORMATS)


def test_the_outlier_layer_ranks_worst_under_tensorwise_and_gets_a_finer_recipe(audit):
    assert audit.ranking("fp8")[0] == "4"  # the third Linear of the Sequential
    rec = audit.recommended
    assert COARSE_TO_FINE.index(rec["4"]) > COARSE_TO_FINE.index("fp8")
    assert rec["0"] == rec["2"] == rec["6"] == "fp8"
    worst = {r.name: r for r in audit.layers if r.format == "fp8"}["4"]
    assert worst.sqnr_db - worst.sqnr_worst_db > 10  # the whole tensor hides the crushed channels
    assert worst.underflow > 0.01  # the typical weights flush below the outliers' scale


def test_without_the_outliers_the_same_layer_keeps_fp8(audit):
    clean = audit_model(make_model(outliers=False), make_batch(), ("fp8",))
    assert set(clean.recommended.values()) == {"fp8"}
    with_outliers = {r.name: r.sqnr_worst_db for r in audit.layers if r.format == "fp8"}
    without = {r.name: r.sqnr_worst_db for r in clean.layers}
    assert without["4"] > with_outliers["4"] + 10


def test_isolation_keeps_a_layer_from_paying_for_the_layers_before_it(audit):
    prop = audit_model(make_model(), make_batch(), ("fp8",), isolate=False)
    iso = {r.name: r.sqnr_db for r in audit.layers if r.format == "fp8"}
    after = {r.name: r.sqnr_db for r in prop.layers}
    assert after["6"] < iso["6"] - 1  # layer 4's error propagates into layer 6 without isolation
    assert after["0"] == pytest.approx(iso["0"], abs=1e-9)  # the first layer sees the same input either way


def test_dynamic_range_and_saturation_counts():
    model = make_model()
    res = audit_model(model, make_batch(), ("fp8",))
    w = model[4].weight.detach().abs()
    assert res.dynamic_range["4"]["weight"] == pytest.approx(math.log2(w.max() / w[w > 0].min()))
    x = torch.tensor([[1.9, 1.0, 0.5, 2.0 ** -19] + [0.0] * 28])  # MX floor: scale 2^(0 - 8): 1.9 / 2^-8 clips
    assert _saturation(x, MX(elem="e4m3"), "input") == (1, 1, 32)  # 2^-19 / 2^-8 < half the smallest subnormal


def test_cli_json_schema_progress_and_exit_codes(capsys):
    rc = main(["audit", "model", f"{MLP}:make_model", "--batch", f"{MLP}:make_batch", "--formats",
               "fp8,fp8-rowwise", "--json"])
    out = capsys.readouterr()
    assert rc == 0
    rep = json.loads(out.out)
    assert set(rep) == {"layers"} and len(rep["layers"]) == 8
    assert all(set(e) == KEYS for e in rep["layers"])
    assert [e["format"] for e in rep["layers"]] == ["fp8"] * 4 + ["fp8-rowwise"] * 4
    assert rep["layers"][0]["name"] == "4" and all(isinstance(e["sqnr_db"], float) for e in rep["layers"])
    assert "audit model [" in out.err
    rc = main(["audit", "model", f"{MLP}:make_model", "--formats", "fp8"])  # make_batch found by default
    out = capsys.readouterr().out
    assert rc == 0 and "fp8 (worst first; threshold 15 dB)" in out and "recommended" in out


@pytest.mark.parametrize("argv,msg", [
    (["nomodule"], "expected MODULE:NAME"),
    (["no_such_module_xyz:f"], "import failed"),
    ([f"{HERE}/nope.py:f"], "no such file"),
    ([f"{MLP}:nope"], "has no 'nope'"),
    ([f"{MLP}:make_model", "--formats", "fp9"], "unknown format"),
    ([f"{MLP}:make_model", "--batch", f"{MLP}:WIDTH"], "failed"),
    (["torch.nn:ReLU", "--batch", f"{MLP}:make_batch"], "has no Linear layers"),
])
def test_bad_requests_exit_2_with_a_message(capsys, argv, msg):
    rc = main(["audit", "model", *argv])
    assert rc == 2 and msg in capsys.readouterr().err

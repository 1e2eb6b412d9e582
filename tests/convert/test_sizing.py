"""The size rule of ``lowbit.convert`` (``lowbit.sizing``): on a device with a rule, layers below
its K x N thresholds stay in high precision, named in the one warning; ``filter=`` overrides;
no rule on the CPU or the meta device; the thresholds are monotone; ``corners_from_gains``
recovers a planted staircase from a gain grid and never keeps a shape whose larger neighbours lose."""
import itertools
import warnings

import pytest
import torch
from torch import nn

import lowbit
from lowbit import sizing
from lowbit.convert import FORMATS, recipe_for


def _model():
    """Shapes of an 85M Llama (768, 3072) and of Llama-3-8B (4096, 1024 KV, 14336), on meta."""
    dims = [(768, 768), (768, 3072), (3072, 768), (4096, 1024), (4096, 14336), (14336, 4096), (4096, 4096)]
    return nn.Sequential(*[nn.Linear(k, n, bias=False, device="meta") for k, n in dims])


def _convert(fmt, **kw):
    m = _model()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        lowbit.convert(m, fmt, **kw)
    kept = {int(i) for i, mod in m.named_children() if not isinstance(mod, lowbit.nn.LowbitModule)}
    return kept, "\n".join(str(x.message) for x in w)


def test_convert_keeps_small_layers_on_a_device_with_a_rule(monkeypatch):
    kept, _ = _convert("fp8")
    assert kept == set()  # meta device: no size rule
    monkeypatch.setattr(sizing, "rule_for", lambda device: sizing.HOPPER)
    for fmt in FORMATS:
        sizes = sizing.HOPPER.sizes(sizing.family(recipe_for(fmt)))
        kept, msg = _convert(fmt)
        small = {i for i, mod in enumerate(_model()) if sizes is not None
                 and not sizes.gains(mod.in_features, mod.out_features)}
        assert kept == small, fmt
        assert msg.count("too small to gain") == len(small), (fmt, msg)
    assert _convert("fp8")[0] >= {0, 1, 2}  # the 85M shapes gain from no FP8 family on Hopper
    assert 4 not in _convert("fp8-block")[0]  # the 8B FFN gains from every one
    kept, msg = _convert("fp8", filter=lambda name, mod: True)  # filter= replaces the rule
    assert kept == set() and "too small" not in msg
    kept, _ = _convert("fp8", backend="torch")  # the exact emulation is not chosen for speed
    assert kept == set()


def test_no_rule_on_cpu_or_meta_and_every_format_has_a_family():
    assert sizing.rule_for(torch.device("cpu")) is None and sizing.rule_for(torch.device("meta")) is None
    assert {sizing.family(recipe_for(f)) for f in FORMATS} <= set(sizing.FAMILIES)
    with pytest.raises(ValueError, match="families"):
        sizing.SizeRule("x", (9, 0), 8192, 0.1, sizing.HOPPER.families[:-1])


def test_layer_sizes_take_only_minimal_corners():
    with pytest.raises(ValueError, match="minimal"):
        sizing.LayerSizes(((1024, 4096), (2048, 4096)))  # the second corner adds nothing
    with pytest.raises(ValueError, match="minimal"):
        sizing.LayerSizes(((2048, 1024), (1024, 4096)))  # not in K order


def test_corners_from_gains_recovers_a_planted_staircase_and_stays_conservative():
    grid = [512, 768, 1024, 2048, 4096, 8192]
    planted = sizing.LayerSizes(((768, 8192), (1024, 2048), (4096, 768)))
    gain = {(k, n): 0.2 if planted.gains(k, n) else -0.3 for k, n in itertools.product(grid, grid)}
    assert sizing.corners_from_gains(grid, grid, gain, 0.1) == planted.corners
    assert sizing.corners_from_gains(grid, grid, gain, 0.25) == ()  # nothing gains a quarter
    dip = dict(gain)
    dip[(4096, 4096)] = 0.05  # one measured loss inside the region
    derived = sizing.LayerSizes(sizing.corners_from_gains(grid, grid, dip, 0.1))
    for k, n in itertools.product(grid, grid):
        larger = [(k2, n2) for k2, n2 in dip if k2 >= k and n2 >= n]
        assert derived.gains(k, n) == all(dip[p] >= 0.1 for p in larger), (k, n)
    assert not derived.gains(2048, 2048) and derived.gains(8192, 2048) and derived.gains(2048, 8192)
    missing = dict(gain)
    del missing[(8192, 8192)]  # a shape that failed to measure counts as no gain
    assert sizing.corners_from_gains(grid, grid, missing, 0.1) == ()

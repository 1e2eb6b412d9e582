"""Checkpoints of converted models: resume in a fresh process bit for bit (model, optimizer and
recipe state: delayed amax histories, the NVFP4 stochastic-rounding step), and plain <-> converted
state_dicts in both directions."""
import importlib.util
import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

import lowbit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
_spec = importlib.util.spec_from_file_location("ckpt_worker", os.path.join(HERE, "ckpt_worker.py"))
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


def test_resume_in_fresh_process_is_bit_exact(tmp_path):
    expected = {}
    for fmt in ("fp8", "nvfp4"):
        m, opt = worker.make(fmt)
        worker.train(m, opt, 0, 3)
        torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, tmp_path / f"{fmt}.pt")
        expected[fmt] = [v.hex() for v in worker.train(m, opt, 3, 3)]
    # the recipe state is in the checkpoint
    sd = torch.load(tmp_path / "fp8.pt", weights_only=True)["model"]
    assert (sd["0.lowbit_state.grad.amax_history"] > 0).sum() == 3
    assert torch.load(tmp_path / "nvfp4.pt", weights_only=True)["model"]["0.lowbit_state.sr._extra_state"] == {"step": 3}
    env = dict(os.environ, OMP_NUM_THREADS="1",  # as this process (conftest): same BLAS order
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, os.path.join(HERE, "ckpt_worker.py"), "3", "3"]
                         + [f"{f}={tmp_path / f'{f}.pt'}" for f in expected],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = {}
    for line in out.stdout.splitlines():
        fmt, v = line.split()
        got.setdefault(fmt, []).append(v)
    assert got == expected


def test_resume_without_recipe_state_differs():
    """Control: the recipe state matters (a fresh delayed state gives other losses)."""
    m, opt = worker.make("fp8")
    worker.train(m, opt, 0, 3)
    sd, osd = m.state_dict(), opt.state_dict()
    ref = worker.train(m, opt, 3, 2)
    m2, opt2 = worker.make("fp8")
    m2.load_state_dict(lowbit.plain_state_dict(sd))  # weights only: recipe state stays fresh
    opt2.load_state_dict(osd)
    assert worker.train(m2, opt2, 3, 2) != ref


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))


def test_plain_checkpoint_into_converted_model_strict():
    plain = _mlp()
    conv = lowbit.convert(_mlp(), "fp8", filter=lambda n, m: True)
    with torch.no_grad():
        for p in plain.parameters():
            p.add_(1.0)
    res = conv.load_state_dict(plain.state_dict(), strict=True)
    assert res.missing_keys == [] and res.unexpected_keys == []
    assert torch.equal(conv[0].weight, plain[0].weight)
    # the keys of the plain model are all there, plus recipe buffers only
    extra = set(conv.state_dict()) - set(plain.state_dict())
    assert extra and all(".lowbit_state." in k for k in extra)
    # a genuinely missing weight is still reported
    sd = plain.state_dict()
    del sd["0.weight"]
    with pytest.raises(RuntimeError, match="0.weight"):
        conv.load_state_dict(sd, strict=True)


def test_converted_checkpoint_into_plain_model():
    conv = lowbit.convert(_mlp(), "fp8", filter=lambda n, m: True)
    conv(torch.randn(4, 32)).sum().backward()
    sd = conv.state_dict()
    plain = _mlp()
    plain.load_state_dict(lowbit.plain_state_dict(sd), strict=True)
    assert torch.equal(plain[2].weight, conv[2].weight)
    res = _mlp().load_state_dict(sd, strict=False)
    assert res.missing_keys == [] and all(".lowbit_state." in k for k in res.unexpected_keys)


def test_whole_model_pickle_roundtrip(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        conv = lowbit.convert(_mlp(), "nvfp4")
    torch.save(conv, tmp_path / "m.pt")
    back = torch.load(tmp_path / "m.pt", weights_only=False)
    x = torch.randn(4, 32)
    assert torch.equal(back(x), conv(x))


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_hf_save_pretrained_is_a_plain_checkpoint_and_loads_back_primed_again(tmp_path, fmt):
    transformers = pytest.importorskip("transformers", reason="a test dependency (pip install -e .[test])")
    from lowbit.nn.linear import is_state_key
    cfg = transformers.LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    ids = torch.randint(0, 48, (2, 8), generator=torch.Generator().manual_seed(0))

    def step(m):
        m.zero_grad()
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in m.parameters()]

    def converted(m):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # lm_head stays in high precision
            return lowbit.convert(m, fmt)

    torch.manual_seed(0)
    conv = converted(transformers.LlamaForCausalLM(cfg))
    step(conv)  # the recipe state is no longer fresh
    sd = conv.state_dict()
    assert any(is_state_key(k) for k in sd)  # torch.save of the state_dict keeps the recipe state
    conv.save_pretrained(tmp_path)
    plain, info = transformers.LlamaForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    weights = lowbit.plain_state_dict(sd)
    assert set(plain.state_dict()) == set(weights)
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in weights.items())
    # back into a converted model: the same weights, the recipe state primed again (fresh): its first
    # step is that of a model converted from the plain checkpoint, bit for bit
    back = converted(transformers.LlamaForCausalLM.from_pretrained(tmp_path))
    assert all(torch.equal(back.state_dict()[k], v) for k, v in weights.items())
    fresh = converted(plain)
    assert all(torch.equal(back.state_dict()[k], v) if torch.is_tensor(v) else back.state_dict()[k] == v
               for k, v in fresh.state_dict().items())
    (l1, g1), (l2, g2) = step(back), step(fresh)
    assert torch.equal(l1, l2) and all(torch.equal(a, b) for a, b in zip(g1, g2))
    lowbit.unconvert(conv)
    assert not any(is_state_key(k) for k in conv._keys_to_ignore_on_save)

"""``lowbit.convert(model, fmt, attention=True)``: a Hugging Face Llama (tiny, from its config) gets
the attention implementation "lowbit", its attention calls reach lowbit's FP8 attention (the exact
emulation on the CPU), it trains within noise of the plain model, and ``unconvert`` restores it.
A model that is not a Hugging Face one is left alone with a warning."""
import copy
import warnings
from unittest import mock

import pytest
import torch

import lowbit
import lowbit.nn.hf_attention as hf_attention

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e .[test])")

STEPS = 24
TOL = 0.03  # relative, on the mean of the last 4 losses (tests/convert/test_clients.py's fp8 tolerance)


def _llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=48, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)


def _train(model):
    g = torch.Generator().manual_seed(0)
    start = torch.randint(0, 48, (4, 8, 1), generator=g)
    batches = (start + torch.arange(32)) % 48  # next token = token + 1
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    losses = []
    for i in range(STEPS):
        ids = batches[i % len(batches)]
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_llama_trains_on_fp8_attention_within_noise():
    model = _llama()
    ref = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the converted-layers report
        lowbit.convert(model, "fp8", filter=lambda name, mod: False, attention=True)  # attention only
    assert model.config._attn_implementation == "lowbit"
    with mock.patch.object(hf_attention, "scaled_dot_product_attention",
                           wraps=hf_attention.scaled_dot_product_attention) as spy:
        losses = _train(model)
    assert spy.call_count == 2 * STEPS  # two layers a step
    assert all(call.kwargs["attn_mask"] is None and call.kwargs["is_causal"] for call in spy.call_args_list)
    ref_losses = _train(ref)
    tail, ref_tail = sum(losses[-4:]) / 4, sum(ref_losses[-4:]) / 4
    assert tail < 0.8 * losses[0], losses
    assert abs(tail - ref_tail) <= TOL * ref_tail, (losses, ref_losses)
    lowbit.unconvert(model)
    assert model.config._attn_implementation == "sdpa" and not hasattr(model.config, hf_attention.CONFIG_KEY)


def test_padding_mask_falls_back_with_a_warning():
    model = _llama()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the converted-layers report
        lowbit.convert(model, "fp8", filter=lambda name, mod: False, attention=lowbit.scaling.AttentionRecipe(block=64))
    assert model.config.lowbit_attention["block"] == 64
    ids = torch.randint(0, 48, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0
    with pytest.warns(UserWarning, match="attn_mask is given"):
        model(input_ids=ids, attention_mask=mask)


def test_non_hf_model_is_left_alone():
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32))
    with pytest.warns(UserWarning) as record:
        lowbit.convert(model, "fp8", attention=True)
    assert any("not a Hugging Face PreTrainedModel" in str(w.message) for w in record)
    assert isinstance(model[0], lowbit.nn.Linear)

"""Real clients, built from tiny configs (no downloads): Hugging Face LlamaForCausalLM,
GPT2LMHeadModel (its Conv1D layers become TransposedLinear) and ViTForImageClassification
(our ViT client: timm cannot be imported beside torch 2.13 CPU, since PyPI's torchvision wheels
need CUDA torch libraries, and timm imports torchvision at import time).

Each model is trained a few dozen steps in fp32 and, from the same initial weights and data,
converted: the converted run's loss decreases, and the mean of its last 4 losses stays within
TOL (relative) of the fp32 run's."""
import copy
import warnings

import pytest
import torch

import lowbit
from lowbit.nn import LowbitModule, TransposedLinear

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e .[test])")

TOL = {"fp8": 0.03, "nvfp4": 0.08, "vit": 0.10}  # vit: 4 classes, 8 batches, a noisier loss
STEPS = 24


def llama():
    cfg = transformers.LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(cfg), "lm"


def gpt2():
    cfg = transformers.GPT2Config(vocab_size=48, n_embd=32, n_layer=1, n_head=2, n_positions=32,
                                  bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg), "lm"


def vit():
    cfg = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=64, num_labels=4)
    return transformers.ViTForImageClassification(cfg), "img"


def _batches(kind):
    g = torch.Generator().manual_seed(0)
    if kind == "lm":  # a learnable sequence task: next token = (token + 1) mod 48
        start = torch.randint(0, 48, (4, 8, 1), generator=g)
        return [{"input_ids": ids, "labels": ids} for ids in (start + torch.arange(16)) % 48]
    imgs = torch.randn(4, 8, 3, 8, 8, generator=g)
    labels = (imgs[:, :, 0].mean(dim=(-1, -2)) > 0).long() + 2 * (imgs[:, :, 1].mean(dim=(-1, -2)) > 0).long()
    return [{"pixel_values": x, "labels": y} for x, y in zip(imgs, labels)]


def _train(model, batches):
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    losses = []
    for i in range(STEPS):
        loss = model(**batches[i % len(batches)]).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("build,fmt,n_expected", [(llama, "fp8", 7), (gpt2, "fp8", 4), (vit, "fp8", 6),
                                                   (llama, "nvfp4", 7)],
                         ids=["llama-fp8", "gpt2-fp8", "vit-fp8", "llama-nvfp4"])
def test_client_trains_close_to_fp32(build, fmt, n_expected):
    torch.manual_seed(0)
    model, kind = build()
    ref = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lowbit.convert(model, fmt)
    layers = [m for m in model.modules() if isinstance(m, LowbitModule)]
    assert len(layers) == n_expected
    if build is gpt2:
        assert all(isinstance(m, TransposedLinear) for m in layers)
    batches = _batches(kind)
    ref_losses = _train(ref, batches)
    losses = _train(model, batches)
    tail, ref_tail = sum(losses[-4:]) / 4, sum(ref_losses[-4:]) / 4
    assert tail < 0.8 * losses[0], losses
    tol = TOL["vit"] if build is vit else TOL[fmt]
    assert abs(tail - ref_tail) <= tol * ref_tail, (losses, ref_losses)


def test_gpt2_unconvert_gives_back_hf_conv1d_with_the_trained_weights():
    torch.manual_seed(0)
    model, _ = gpt2()
    ids = torch.randint(0, 48, (2, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lowbit.convert(model, "fp8-current")
    y_conv = model(input_ids=ids).logits
    lowbit.unconvert(model)
    conv1d = transformers.pytorch_utils.Conv1D
    assert sum(isinstance(m, conv1d) for m in model.modules()) == 4
    assert not any(isinstance(m, LowbitModule) for m in model.modules())
    y_plain = model(input_ids=ids).logits
    assert ((y_plain - y_conv).norm() / y_plain.norm()) < 0.1  # same weights, now without quantization

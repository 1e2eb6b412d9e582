"""What the monitor tests (and benchmarks/monitor.py's checks) build: a tiny Hugging Face Llama
from config, its batches and training loop, and a module whose backward makes a NaN."""
import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 48


def tiny_llama(layers: int = 1, seed: int = 0):
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                   use_cache=False)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg)


def batches(n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (2, 8), generator=g) for _ in range(n)]


class NaNGrad(torch.autograd.Function):
    """Identity whose backward multiplies the gradient by ``gain`` (NaN plants a NaN)."""

    @staticmethod
    def forward(ctx, x, gain):
        ctx.save_for_backward(gain)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * ctx.saved_tensors[0], None


class PlantedSiLU(nn.Module):
    """SiLU whose backward makes NaN from finite gradients while ``gain`` holds NaN."""

    def __init__(self):
        super().__init__()
        self.register_buffer("gain", torch.ones(()))

    def forward(self, x):
        return NaNGrad.apply(F.silu(x), self.gain)


def train(model, ids_list, mon, before_step=lambda i: None, optimizer=None):
    opt = optimizer or torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i, ids in enumerate(ids_list):
        before_step(i)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()  # with mon.optimizer set, this ends the monitor's step first
        opt.zero_grad()
        if mon.optimizer is None:
            mon.step()
    return opt

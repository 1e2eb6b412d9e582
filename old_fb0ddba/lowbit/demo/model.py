"""A small byte-level GPT (pre-LayerNorm, causal SDPA attention, GELU MLP, learned positions).

Parameters: ``12 * n_layer * d^2`` in the blocks plus ``(256 + seq_len) * d`` embeddings and the
``d x 256`` output head (kept in high precision by ``lowbit.convert``'s default filter). Every
Linear of the blocks has K and N multiples of 32, so every format converts all of them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPTConfig", "GPT", "SIZES"]


@dataclass(frozen=True)
class GPTConfig:
    d_model: int = 64
    n_layer: int = 2
    n_head: int = 4
    seq_len: int = 64
    vocab: int = 256


SIZES = {
    "tiny": GPTConfig(d_model=64, n_layer=2, n_head=4, seq_len=64),  # ~0.1M: a laptop CPU, < 2 min
    "small": GPTConfig(d_model=256, n_layer=4, n_head=4, seq_len=128),  # ~3.2M
    "50m": GPTConfig(d_model=768, n_layer=7, n_head=12, seq_len=256),  # ~50M: one GPU
}


class Block(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.n_head = c.n_head
        self.ln1 = nn.LayerNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.ln2 = nn.LayerNorm(c.d_model)
        self.fc = nn.Linear(c.d_model, 4 * c.d_model)
        self.fc_out = nn.Linear(4 * c.d_model, c.d_model)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.n_head, D // self.n_head).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, D))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.config = c
        self.tok = nn.Embedding(c.vocab, c.d_model)
        self.pos = nn.Embedding(c.seq_len, c.d_model)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.lm_head = nn.Linear(c.d_model, c.vocab, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / (2 * c.n_layer) ** 0.5 if name.endswith(("proj.weight", "fc_out.weight")) else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

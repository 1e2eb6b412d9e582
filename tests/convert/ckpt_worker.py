"""Checkpoint round trip helper: ``python ckpt_worker.py START STEPS FMT=CKPT...``: for each
format, builds the model, loads ``CKPT`` (model + optimizer + recipe state, ``weights_only=True``),
trains STEPS steps from step START and prints ``FMT <loss as float hex>`` lines. The test imports
the same functions for the first half of the run."""
import sys
import warnings

import torch
from torch import nn

import lowbit


def make(fmt: str):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32), nn.GELU(), nn.Linear(32, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the head (32 -> 8) stays in high precision
        lowbit.convert(m, fmt)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    return m, opt


def train(m, opt, start: int, steps: int):
    losses = []
    for i in range(start, start + steps):
        g = torch.Generator().manual_seed(1000 + i)
        x = torch.randn(48, 32, generator=g)
        y = torch.randn(48, 8, generator=g)
        loss = (m(x) - y).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    start, steps = int(sys.argv[1]), int(sys.argv[2])
    for arg in sys.argv[3:]:
        fmt, path = arg.split("=", 1)
        m, opt = make(fmt)
        ck = torch.load(path, weights_only=True)
        m.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        for v in train(m, opt, start, steps):
            print(fmt, v.hex())

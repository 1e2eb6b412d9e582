"""A 4-layer MLP whose third layer's weight holds four outliers 1e5x its typical value (the audit's
acceptance case), and a batch for it; ``lowbit audit model tests/validate/mlp.py:make_model
--batch tests/validate/mlp.py:make_batch`` loads them."""
import torch
from torch import nn

WIDTH = 256


def make_model(outliers: bool = True) -> nn.Module:
    g = torch.Generator().manual_seed(0)
    layers = []
    for i in range(4):
        lin = nn.Linear(WIDTH, WIDTH)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(WIDTH, WIDTH, generator=g) / WIDTH ** 0.5)
            lin.bias.zero_()
            if i == 2 and outliers:
                rows = torch.tensor([3, 70, 141, 200])
                lin.weight[rows, rows] = 1e5 / WIDTH ** 0.5
        layers += [lin, nn.ReLU()] if i < 3 else [lin]
    return nn.Sequential(*layers)


def make_batch() -> torch.Tensor:
    return torch.randn(64, WIDTH, generator=torch.Generator().manual_seed(1))

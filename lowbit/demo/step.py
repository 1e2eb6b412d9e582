"""One training step of the demo (forward, backward, clip to norm 1, AdamW, zero grads), eager or
replayed from a CUDA graph.

The graph holds the whole step; every replay runs the same kernels as the eager step on the same
static buffers (batch, parameters, gradients, optimizer and delayed-scaling state), so the math is
the eager math without the per-kernel launch cost (the 50M demo is launch-bound in eager mode).
AdamW runs with ``capturable=True`` and a tensor learning rate, on every CUDA run, graphed or not,
so all formats share one optimizer. A step that cannot be captured stays eager, and the reason is
reported.
"""
from __future__ import annotations

from typing import Optional

import torch

__all__ = ["make_optimizer", "set_lr", "TrainStep"]


def make_optimizer(model: torch.nn.Module, lr: float, device: torch.device) -> torch.optim.Optimizer:
    """AdamW(betas 0.9/0.95, weight decay 0.1); on CUDA the fused kernel, capturable, with a tensor
    learning rate (the multi-tensor capturable AdamW is several times slower on the GPU)."""
    kw = dict(weight_decay=0.1, betas=(0.9, 0.95))
    if device.type == "cuda":
        return torch.optim.AdamW(model.parameters(), lr=torch.tensor(lr, device=device), capturable=True,
                                 fused=True, **kw)
    return torch.optim.AdamW(model.parameters(), lr=lr, **kw)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


class TrainStep:
    """``step(x, y) -> loss`` (a detached 0-dim tensor, no host sync).

    ``graph=True`` captures the step on the first call after ``warmup`` eager steps (run on a side
    stream, as CUDA graph capture requires); if capture fails the step stays eager and
    ``self.graph_error`` says why."""

    def __init__(self, model, opt, amp: bool, device: torch.device, graph: bool, warmup: int = 3):
        self.model, self.opt, self.amp, self.device = model, opt, amp, device
        self.want_graph = graph and device.type == "cuda"
        self.warmup, self.calls = warmup, 0
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.graph_error: Optional[str] = None
        self._stream = torch.cuda.Stream(device) if self.want_graph else None

    def _eager(self, x, y) -> torch.Tensor:
        # autocast's weight cache must be off for graph capture; it only saves re-casts in eager
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp, cache_enabled=False):
            loss = self.model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def _capture(self, x, y) -> None:
        self.x, self.y = x.clone(), y.clone()
        g = torch.cuda.CUDAGraph()
        self.opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp, cache_enabled=False):
                loss = self.model(self.x, self.y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
        self.graph, self.loss = g, loss.detach()

    def __call__(self, x, y) -> torch.Tensor:
        self.calls += 1
        if self.graph is not None:
            self.x.copy_(x)
            self.y.copy_(y)
            self.graph.replay()
            return self.loss.clone()
        if not self.want_graph or self.graph_error is not None:
            return self._eager(x, y)
        if self.calls <= self.warmup:  # warm-up steps are real steps, run on the side stream
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._stream):
                loss = self._eager(x, y)
            torch.cuda.current_stream(self.device).wait_stream(self._stream)
            return loss
        try:
            self._capture(x, y)
        except Exception as e:  # e.g. a host sync inside the step: stay eager
            self.graph, self.graph_error = None, f"{type(e).__name__}: {e}"[:300]
            self.opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize(self.device)
            return self._eager(x, y)
        self.graph.replay()  # capture runs nothing: this replay is the step itself
        return self.loss.clone()

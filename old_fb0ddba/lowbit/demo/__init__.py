"""``lowbit demo``: a small byte-level GPT trained on Python's own standard library sources, in bf16
and in low-precision formats with the same seed and data order, compared in a table and a PNG.

``corpus`` (the text), ``model`` (the GPT and its sizes), ``train`` (one run per format),
``report`` (table, JSON-ready rows, PNG of the loss curves).
"""
from .train import DemoConfig, run_demo

__all__ = ["DemoConfig", "run_demo"]

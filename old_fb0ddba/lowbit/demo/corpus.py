"""The demo corpus: bytes of the Python standard library's own ``.py`` sources (ships with every
Python; nothing is downloaded). Files are read in sorted path order, skipping test suites,
``site-packages`` and ``idlelib``, until ``max_bytes``; the text is the same on every machine with
the same Python version. Byte-level: token = byte value (vocabulary 256).
"""
from __future__ import annotations

import os
import sysconfig

import torch

__all__ = ["load_corpus", "split"]

_SKIP_DIRS = {"test", "tests", "site-packages", "dist-packages", "idlelib", "__pycache__", "lib2to3"}


def _files(root: str):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for f in sorted(filenames):
            if f.endswith(".py"):
                yield os.path.join(dirpath, f)


def load_corpus(max_bytes: int = 2_000_000) -> torch.Tensor:
    """uint8 tensor of at most ``max_bytes`` bytes of stdlib source."""
    root = sysconfig.get_paths()["stdlib"]
    parts, n = [], 0
    for path in _files(root):
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        parts.append(data[: max_bytes - n])
        n += len(parts[-1])
        if n >= max_bytes:
            break
    if n < 10_000:
        raise RuntimeError(f"found only {n} bytes of Python sources under {root}")
    return torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8)


def split(data: torch.Tensor, val_fraction: float = 0.05):
    """(train, val): the last ``val_fraction`` of the bytes is held out."""
    cut = int(len(data) * (1 - val_fraction))
    return data[:cut], data[cut:]

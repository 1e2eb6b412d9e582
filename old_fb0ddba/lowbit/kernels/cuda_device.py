"""Compute capability and SM count of a CUDA device, read from the driver once per device (an
``lru_cache``: the launchers ask on every call, and ``torch.cuda.get_device_properties`` costs
microseconds each time)."""
from __future__ import annotations

import functools

import torch

__all__ = ["gpu", "capability", "sm_count"]


@functools.lru_cache(maxsize=None)
def gpu(index: int) -> tuple:
    """((major, minor), SM count) of CUDA device ``index``."""
    props = torch.cuda.get_device_properties(index)
    return (props.major, props.minor), props.multi_processor_count


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def capability(device: torch.device) -> tuple:
    """(major, minor) of a CUDA ``device``."""
    return gpu(_index(device))[0]


def sm_count(device: torch.device) -> int:
    """SMs of a CUDA ``device``."""
    return gpu(_index(device))[1]

"""Shared test settings."""
import pytest
import torch

# Training and audit tests (tiny tensors, many steps): one intra-op thread. On a shared 2-core machine
# OpenMP threads waiting on each other made their steps 10-20x slower.
_ONE_THREAD_DIRS = ("nn", "convert", "demo", "monitor", "validate", "attention")


@pytest.fixture(autouse=True)
def _one_thread_for_training_tests(request):
    if request.node.path.parent.name not in _ONE_THREAD_DIRS:
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

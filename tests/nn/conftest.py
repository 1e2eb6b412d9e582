"""One intra-op thread for these tests: their tensors are tiny, and on a shared 2-core machine
OpenMP threads waiting on each other made steps 10-20x slower."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

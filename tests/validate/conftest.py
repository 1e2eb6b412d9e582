"""One intra-op thread for the audit tests: their tensors are small, and on a shared 2-core machine
OpenMP threads waiting on each other made each op several times slower."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

"""Fixtures of the fma_guard tests (helpers in ``fma_fixtures``): fixture kernels compiled once per session."""
import pytest

from fma_fixtures import load_fixture


@pytest.fixture(scope="session")
def fixtures():
    return {name: load_fixture(name) for name in ("online_softmax", "rowwise", "attention", "compare")}

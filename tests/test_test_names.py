"""Every test module has a basename of its own: the test folders are not packages, so pytest imports
each file under its basename, and two files of one name stop the whole collection."""
import collections
import os

TESTS = os.path.dirname(os.path.abspath(__file__))


def test_test_module_basenames_are_unique():
    names = collections.Counter(f for _, _, files in os.walk(TESTS) for f in files
                                if f.endswith(".py") and f not in ("__init__.py", "conftest.py"))
    assert not [n for n, c in names.items() if c > 1]

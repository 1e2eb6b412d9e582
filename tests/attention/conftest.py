"""The attention tests run the Triton kernels in Triton's interpreter on CPU tensors (as
tests/kernels does): TRITON_INTERPRET=1 is set before the test modules import triton."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

"""The kernel tests run Triton kernels on the CPU interpreter. ``@triton.jit`` decides between
compiling and interpreting when it runs (triton's own helpers such as ``tl.max`` at ``import
triton``), so TRITON_INTERPRET=1 is set here, before this directory's test modules import anything;
CI sets it for the whole session. If triton was imported earlier without it, the tests fail and
say so (test_cast_fp8.py checks)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

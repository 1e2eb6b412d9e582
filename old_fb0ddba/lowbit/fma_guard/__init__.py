"""fma_guard: find FMA-contraction hazards in Triton kernels before they produce NaNs.

``scan(kernel, signature, constexprs)`` compiles a kernel for sm_90 on the CPU and judges its PTX;
``explain(finding)`` gives an exact (mpmath) input where contracted and uncontracted results differ;
``guard(kernel)`` launches a kernel with ``enable_fp_fusion=False``; ``differential(...)`` runs a
kernel fused and unfused on a GPU; ``scan_inductor(fn, *args)`` scans the Triton kernels that
torch.compile generates; ``scan_shipped()`` scans every kernel in ``lowbit.kernels``.
Nothing on lowbit's hot path imports this package.
"""
from .compile import compile_kernel
from .differential import DifferentialResult, adversarial_scores, differential
from .explain import Counterexample, explain
from .guard import GuardedKernel, guard
from .inductor import inductor_kernels, scan_inductor
from .scan import FIXES, KINDS, Finding, Report, scan, scan_ptx
from .shipped import ShippedScan, collect_specs, scan_shipped

__all__ = ["scan", "scan_ptx", "Report", "Finding", "KINDS", "FIXES", "compile_kernel", "explain",
           "Counterexample", "guard", "GuardedKernel", "differential", "DifferentialResult",
           "adversarial_scores", "scan_inductor", "inductor_kernels", "collect_specs", "scan_shipped",
           "ShippedScan"]

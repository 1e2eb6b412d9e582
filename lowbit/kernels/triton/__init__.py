"""lowbit's Triton kernels, one place per op family (casts, GEMMs, attention), and their runtime
(``runtime``: device facts, the interpreter switch, launch arithmetic)."""

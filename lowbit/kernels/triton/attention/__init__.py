"""FP8 attention on Triton: ``quantize`` (the cast pass), ``forward``, ``backward`` (kernels),
``launch`` (host side), ``tuning`` (tiles per head dim), ``common`` (shared jit helpers).
Importing this package imports no Triton: ``launch`` does, when a caller needs the kernels."""

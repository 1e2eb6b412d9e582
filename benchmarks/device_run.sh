#!/usr/bin/env bash
# One lease call on the H200: install the carried wheels (torchao), then run the named benchmark
# scripts, each under its own time limit, logging into $OUT. Usage:
#   bash benchmarks/device_run.sh "gemm:300 quantize:150 fma_guard_gpu:90"
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
for item in $1; do
  name=${item%%:*}; limit=${item##*:}
  echo "=== $name (limit ${limit}s) ==="
  timeout "$limit" python3 "benchmarks/$name.py" --out "$OUT" ${EXTRA_ARGS:-} > "$OUT/$name.log" 2>&1
  echo "exit $?" >> "$OUT/$name.log"
  tail -n 40 "$OUT/$name.log"
done

#!/usr/bin/env bash
# One lease call on the H200: install the carried wheels (torchao), then run the named benchmark
# scripts, each under its own time limit and with its own arguments (commas for spaces), all
# logging into $OUT/run.log (a call brings back at most 8 files); prints each script's last lines
# (its table) at the end. Usage (a "%" in the arguments is a literal comma):
#   bash benchmarks/device_run.sh "gemm:300 quantize:150:--sweep,--budget,140 ffn_train:300:--modes,eager%graph"
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
LOG=$OUT/run.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee -a "$LOG"
for item in $1; do
  IFS=: read -r name limit args <<< "$item"
  args=${args//,/ }
  args=${args//%/,}
  echo "=== $name (limit ${limit}s) $args" >> "$LOG"
  # shellcheck disable=SC2086
  timeout "$limit" python3 "benchmarks/$name.py" --out "$OUT" $args >> "$LOG" 2>&1
  echo "exit $? after ${SECONDS}s" | tee -a "$LOG"
done
for item in $1; do
  echo "--- ${item%%:*}"
  awk -v n="=== ${item%%:*} " 'index($0, n) == 1 {p = 1; buf = ""; next} /^=== / {p = 0} p {buf = buf $0 "\n"} END {printf "%s", buf}' "$LOG" \
    | tail -n "${TAIL:-25}"
done

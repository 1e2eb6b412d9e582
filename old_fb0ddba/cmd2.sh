export PYTHONUNBUFFERED=1
timeout 125 python3 benchmarks/bitexact.py --out $OUT/new > /tmp/bx_new.log 2>&1; echo "bitexact new rc=$? $(tail -1 /tmp/bx_new.log)"
timeout 125 python3 old_fb0ddba/benchmarks/bitexact.py --out $OUT/old > /tmp/bx_old.log 2>&1; echo "bitexact old rc=$? $(tail -1 /tmp/bx_old.log)"
python3 - <<'PY'
import json, os
o = os.environ["OUT"]
try:
    a, b = json.load(open(f"{o}/old/bitexact.json")), json.load(open(f"{o}/new/bitexact.json"))
    diff = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    err = [k for k in b if str(b[k]).startswith("error")]
    print(f"BITEXACT cases old={len(a)} new={len(b)} differ={len(diff)} new_errors={len(err)}")
    for k in diff[:15]: print("  DIFF", k, a.get(k), b.get(k))
    for k in err[:5]: print("  ERR", k, b[k])
except Exception as e:
    print("BITEXACT compare failed", e)
PY
export TAIL=22; bash benchmarks/device_run.sh "host_overhead:100 monitor:200:--quick,--dtypes,bf16"
rm -f $OUT/monitor_check_*.jsonl

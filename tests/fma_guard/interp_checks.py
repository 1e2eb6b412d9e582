"""Run by test_fma_guard.py in a fresh interpreter with TRITON_INTERPRET=1 set before triton is imported
(``@triton.jit`` picks compile vs interpret at decoration time, triton's own ``tl.max`` included).

Prints one JSON object: the guarded launch against an exp2 softmax reference, and the differential
run's report, both on adversarial scores."""
import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fma_fixtures import load_fixture  # noqa: E402
from lowbit.fma_guard import adversarial_scores, differential, guard  # noqa: E402

SCALE, ROWS, COLS = 0.18033688, 4, 512
sm = load_fixture("online_softmax")
out = {}

x = adversarial_scores(ROWS, COLS, SCALE, seed=1)
p, arg = torch.empty_like(x), torch.empty_like(x)
guard(sm.online_softmax_exp2_before)[(ROWS,)](x, p, arg, SCALE, COLS, BLOCK=256)
ref = torch.softmax(x.double() * SCALE * np.log(2.0), dim=1)
out["guard_max_rel_err"] = float(((p.double() - ref).abs() / ref).max())
out["guard_max_arg"] = float(arg.max())

p0, a0 = torch.zeros_like(x), torch.zeros_like(x)
res = differential(sm.online_softmax_exp2_before, [x, p0, a0, SCALE, COLS], (ROWS,), constexprs={"BLOCK": 256},
                   outputs=["P", "ARG"], probes={"positive exponent args": lambda o: (o["ARG"] > 0).sum()})
out["diff_outputs"] = [[o.name, o.n_differ, o.numel, o.nan_fused, o.nan_unfused] for o in res.outputs]
out["diff_probes"] = [list(pr) for pr in res.probes]
out["caller_buffers_untouched"] = float(p0.abs().sum() + a0.abs().sum()) == 0.0
out["format"] = res.format()
print(json.dumps(out))

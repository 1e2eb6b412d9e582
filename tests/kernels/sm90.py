"""Compiling kernels for sm_90 in a child process (no GPU needed) and reading their resources.

The kernel tests interpret Triton (TRITON_INTERPRET=1 is set before triton is imported), so real
sm_90 builds run in a child Python without it: ``run_script(source, *args)`` runs ``source`` there
(this folder and the repo root on its path) and returns the JSON of its last output line;
``usage(compiled)`` (called in the child) gives the cubin's registers and stack bytes a thread as
``cuobjdump -res-usage`` reports them.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def usage(compiled) -> dict:
    """{"regs": REG, "stack": STACK} of a ``triton.compile`` result's cubin."""
    import tempfile

    import triton
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        res = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True)
    u = dict(w.split(":") for w in res.stdout.split("Function")[-1].split() if ":" in w)
    return {"regs": int(u["REG"]), "stack": int(u["STACK"])}


def run_script(source: str, *args: str, env_extra: dict = None, timeout: int = 300):
    """Run ``source`` in a child Python without TRITON_INTERPRET; the JSON of its last line."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_extra or {})
    env["PYTHONPATH"] = os.pathsep.join([ROOT, HERE] + [p for p in [env.get("PYTHONPATH")] if p])
    res = subprocess.run([sys.executable, "-c", source, *args], capture_output=True, text=True, env=env,
                         timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])

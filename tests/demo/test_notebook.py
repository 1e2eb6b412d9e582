"""notebooks/01_quickstart.ipynb runs top to bottom on the CPU (nbclient + ipykernel, test extra)
and shows what it promises: the skip warning, the loss comparison, the recipe state."""
import os

import nbformat
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _text(cell):
    return "".join(o.get("text", "") or "".join(o.get("data", {}).get("text/plain", "")) for o in cell.get("outputs", []))


def test_quickstart_notebook_executes(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(os.path.join(ROOT, "notebooks", "01_quickstart.ipynb"), as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": ROOT}}).execute()
    out = "\n".join(_text(c) for c in nb.cells if c.cell_type == "code")
    assert "kept 1 layer(s) in high precision" in out and "4: " in out
    assert "final loss gap:" in out and "grad   e5m2" in out
    for fmt in ("fp8", "fp8-block", "mxfp8", "nvfp4"):
        assert f"\n{fmt} " in out
    assert "torch.nn.modules.linear True" in out

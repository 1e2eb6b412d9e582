"""notebooks/02_numerics.ipynb runs top to bottom on the CPU and finds the NaN it plants: the
culprit (module, phase, step), the report, and the replay that traces it to the weight; its audit
section ranks the outlier layer of its MLP and recommends a finer format for it alone."""
import os

import nbformat
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _text(cell):
    outs = cell.get("outputs", [])
    return "".join(o.get("text", "") or "".join(o.get("data", {}).get("text/plain", "")) for o in outs)


def test_numerics_notebook_plants_a_nan_and_finds_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(os.path.join(ROOT, "notebooks", "02_numerics.ipynb"), as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    out = "\n".join(_text(c) for c in nb.cells if c.cell_type == "code")
    assert "step 3: 1 non-finite in blocks.1.fc_out forward weight" in out
    assert "3 loss nan" in out and "2 loss nan" not in out
    assert "first non-finite: step 3" in out
    assert "1 non-finite at [4, 10]=nan" in out and "reproduced: yes" in out
    assert "{'4': 'fp8-rowwise', '6': 'fp8', '2': 'fp8', '0': 'fp8'}" in out  # worst layer first
    assert (tmp_path / "numerics.jsonl").exists() and (tmp_path / "flight.pt").exists()

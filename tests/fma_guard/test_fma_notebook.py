"""notebooks/03_fma_hazard.ipynb executes top to bottom on the CPU (nbclient + ipykernel)."""
import os

import nbformat
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NB = os.path.join(ROOT, "notebooks", "03_fma_hazard.ipynb")


def test_notebook_executes_and_shows_the_hazard():
    nb = nbformat.read(NB, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": os.path.dirname(NB)}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "max-of-rounded-products" in text
    assert "positive exponent arguments: fused" in text and "unfused 0" in text
    assert "fma" in text and "0 hazard(s)" in text

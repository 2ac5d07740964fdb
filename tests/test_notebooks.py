"""Every notebook runs top to bottom in its quick mode (``JAXVB_QUICK=1``)."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("JAXVB_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    errors = [
        o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"
    ]
    assert not errors

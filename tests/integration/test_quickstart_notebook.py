"""docs/quickstart.ipynb runs from top to bottom: on the toy model, and on the bundled SmolLM2.

The notebook is executed with nbclient (the engine nbmake uses), once per model, because nbmake
runs a notebook once with no parameters. Its outputs are stripped in git.

The toy run is in every `make test`. The SmolLM2 run (about two minutes: transformers dequantizes
the GGUF in the kernel, which shares no model with the suite) runs the same cells on the real
model, which the shared SmolLM2 scan already covers through the API; it runs with
`make docs-outputs`, which regenerates the real-model pages the notebook's text quotes.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "quickstart.ipynb"


def _execute(env: dict[str, str], tmp_path: Path) -> nbformat.NotebookNode:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)  # the kernel inherits the environment
    try:
        NotebookClient(
            notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
        ).execute()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return notebook


def _outputs(notebook: nbformat.NotebookNode) -> str:
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            parts += [str(v) for v in output.get("data", {}).values()]
    return "\n".join(parts)


def test_the_notebook_is_committed_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)


def test_quickstart_on_the_toy(toy_dir, toy_texts, tmp_path):
    notebook = _execute({"QUICKSTART_MODEL": str(toy_dir), "QUICKSTART_TEXTS": str(toy_texts)}, tmp_path)
    shown = _outputs(notebook)
    assert "<headscope.Result scan of" in shown
    assert "<iframe" in shown  # the report, inline
    assert "strongest induction head: L1H" in shown  # the toy's induction heads sit in layer 1
    assert "top-2 Δloss" in shown


@pytest.mark.docs_outputs
def test_quickstart_on_smollm2(tmp_path):
    notebook = _execute({"QUICKSTART_MODEL": "smollm2-135m"}, tmp_path)
    shown = _outputs(notebook)
    assert "<headscope.Result scan of" in shown and "30x9 heads" in shown
    assert "<iframe" in shown and "top-2 Δloss" in shown

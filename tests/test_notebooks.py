"""The example notebooks run top to bottom in a real Jupyter kernel.

The kernel is this interpreter (``sys.executable``): the test installs a
``python3`` kernelspec pointing at it into a temporary ``JUPYTER_PATH``, which
Jupyter searches first, so neither a user's nor the system's ``python3``
kernel (nor whichever ``python`` is first on ``PATH``) is picked by mistake.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
kernelspec = pytest.importorskip("ipykernel.kernelspec")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NOTEBOOKS = ("quickstart.ipynb", "custom_model_and_data.ipynb")

# Appended to the executed copy: which interpreter ran the cells.
_WHICH_PYTHON = "import sys\nprint(sys.executable)"

# Put after the "parameters" cell, as ``papermill -p seconds 0.3`` does: the
# runs train for 0.3 s rather than the 10-12 a reader's notebook does (every cell
# still runs, on fewer steps: the quickstart's runs are evaluated once, at their end).
_SHORT_RUNS = "seconds = 0.3"


# Put after the cell of the fits that keep their histories in ``histories``: each's
# steps and evaluations, printed.
_FITTED = (
    'print({name: (h.sizes["step"], int(h.accuracy.notnull().sum()))'
    " for name, h in histories.items()})"
)


def parameters_cell(nb: Any) -> int:
    """The index of the notebook's one cell tagged "parameters"."""
    [i] = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    return i


@pytest.fixture
def kernel_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``python3`` kernel of this interpreter; datasets cached and temp files under tmp."""
    jupyter_path = tmp_path / "jupyter"
    kernelspec.write_kernel_spec(jupyter_path / "kernels" / "python3")
    monkeypatch.setenv("JUPYTER_PATH", str(jupyter_path))
    monkeypatch.setenv("DASK_DASKPRI__CACHE_DIR", str(tmp_path / "cache"))
    # The kernel (and the workers it starts) put their temporary files here.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    work = tmp_path / "work"
    work.mkdir()
    return work


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_stored_without_outputs(name: str) -> None:
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    assert nb.cells[parameters_cell(nb)].source.splitlines()[-1].startswith("seconds = ")
    assert nb.metadata.kernelspec.name == "python3"


def outputs(nb: Any) -> list[tuple[str, Any]]:
    """Every output of the code cells, with its cell's source."""
    return [(c.source, out) for c in nb.cells if c.cell_type == "code" for out in c.outputs]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_top_to_bottom(name: str, kernel_env: Path) -> None:
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    injected = nbformat.v4.new_code_cell(_SHORT_RUNS, metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(parameters_cell(nb) + 1, injected)
    fits = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and ".fit(" in c.source]
    if "histories" in nb.cells[fits[-1]].source:  # what the fits made, for the cells after
        nb.cells.insert(fits[-1] + 1, nbformat.v4.new_code_cell(_FITTED))
    nb.cells.append(nbformat.v4.new_code_cell(_WHICH_PYTHON))
    client = nbclient.NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(kernel_env)}},
    )
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:  # the cell and its traceback
        printed = "".join(out.text for _, out in outputs(nb)
                          if out.output_type == "stream" and out.name == "stdout")
        raise AssertionError(f"{e}\n\nthe cells before it printed:\n{printed[-3000:]}") from None
    fitted = [out.text for src, out in outputs(nb)
              if src == _FITTED and out.output_type == "stream" and out.name == "stdout"]
    if "histories" in nb.cells[fits[-1]].source:
        # each fit took steps and was evaluated (at its end at least), in the history plotted
        [line] = "".join(fitted).splitlines()
        counts = ast.literal_eval(line).values()
        assert all(steps > 0 and evaluated > 0 for steps, evaluated in counts), line

    streams = [(src, out.name, out.text) for src, out in outputs(nb) if out.output_type == "stream"]
    last = nb.cells[-1].outputs
    assert [o.text for o in last if o.get("name") == "stdout"] == [sys.executable + "\n"]
    # daskpri's warnings are errors in this suite; tqdm warns when it cannot draw its widget
    unwanted = ("DaskpriWarning",) + (("TqdmWarning",) if find_spec("ipywidgets") else ())
    warned = [(src, text) for src, _, text in streams if any(w in text for w in unwanted)]
    assert not warned, f"warnings while running {name}: {warned}"
    html = [out.data["text/html"] for _, out in outputs(nb) if "text/html" in out.get("data", {})]
    frames = [h for h in html if "<iframe" in h]
    if name == "quickstart.ipynb":  # show() in a kernel: a frame of the scheduler's page
        assert len(frames) == 1
        assert re.search(r'src="http://127\.0\.0\.1:\d+/daskpri"', frames[0])
    if find_spec("ipywidgets"):  # fit(progress=True) draws tqdm.auto's widget
        widget = "application/vnd.jupyter.widget-view+json"
        assert any(widget in out.get("data", {}) for _, out in outputs(nb))

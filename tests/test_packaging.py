"""The newcomer's path: the README's two commands are CI's, and the extras they install bring
everything the test suite and the notebooks import.

Read as text (no tomllib on Python 3.10); nothing is installed here.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_COMMANDS = [
    'pip install -e ".[test]" && q2gemv verify',
    "python -m pytest -q -n auto --dist worksteal --durations=15",
]


def _extra(name: str) -> dict[str, str]:
    """``{distribution: specifier}`` of one optional-dependency list of pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(rf"^{name} = \[(.*?)^\]", text, re.S | re.M)
    assert block, f"pyproject.toml has no {name!r} extra"
    out = {}
    for dep in re.findall(r'"([^"]+)"', block[1]):
        dist = re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0]
        out[dist.lower()] = dep
    return out


def _ci_commands() -> list[str]:
    """The lines of .ci/run that do something (comments and blank lines dropped)."""
    lines = [ln.split(" #")[0].strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


def test_the_test_extra_brings_what_the_tests_import():
    test = _extra("test")
    # torch: tests/nn/test_torch.py and the notebook 06; transformers: tests/models/test_models.py
    for dist in ("torch", "transformers", "pytest", "pytest-xdist", "safetensors", "gguf"):
        assert dist in test, f"the test extra lacks {dist}"
    models = _extra("models")
    assert set(models) <= set(test), "the test extra must bring the models extra's packages"


def test_ci_runs_exactly_the_readme_commands():
    ci = _ci_commands()
    assert [c for c in ci if c in README_COMMANDS] == README_COMMANDS, ci
    # nothing installed beside the README's first line (the venv's pip upgrade aside)
    others = [c for c in ci if "pip install" in c and c != README_COMMANDS[0]]
    assert all("--upgrade pip" in c for c in others), others


def test_ci_pins_torch_and_transformers_through_a_constraints_file():
    ci = (ROOT / ".ci" / "run").read_text()
    m = re.search(r"PIP_CONSTRAINT=(\S+)", ci)
    assert m, ".ci/run must pin CI's versions with PIP_CONSTRAINT (the README lines stay plain)"
    path = ROOT / shlex.split(m[1].replace('"$PWD"/', "").replace("$PWD/", ""))[0]
    pins = dict(
        ln.split("==") for ln in path.read_text().splitlines() if "==" in ln and ln[0] != "#"
    )
    assert pins.get("torch") == "2.13.0" and pins.get("transformers") == "5.24.0"


def test_a_notebooks_extra_installs_jupyter_and_what_the_notebooks_import():
    nb = _extra("notebooks")
    assert "jupyterlab" in nb or "notebook" in nb, "the notebooks extra installs no Jupyter"
    assert {"torch", "transformers", "matplotlib"} <= set(nb)  # notebook 06, notebook 04
    # and the docs say how to use it
    assert 'pip install -e ".[notebooks]"' in (ROOT / "docs" / "notebooks.md").read_text()
    assert "notebooks" in (ROOT / "README.md").read_text()


def test_a_notebooks_extra_has_what_nbconvert_needs():
    text = (ROOT / "pyproject.toml").read_text()  # no tomllib on Python 3.10
    block = re.search(r"^notebooks = \[(.*?)^\]", text, re.S | re.M)
    assert block, "pyproject.toml has no 'notebooks' extra"
    names = {re.split(r"[<>=\[]", d)[0] for d in re.findall(r'"([^"]+)"', block[1])}
    assert {"nbconvert", "ipykernel", "matplotlib", "numba-cuda"} <= names

"""The package's layering, from its import graph (every import, module level or in a function).

Lower layers know nothing of higher ones: the formats, the references, the
registry, the pure geometry and tier logic never import the CUDA kernels, the
API or the benchmark; the kernels never import the API. Where a lower layer
needs something of a higher one, it is injected (``formats._upload``,
``tiers.set_default_resolver``).
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "q2gemv"

# module (or package prefix) -> prefixes it must never import
LOWER = ("formats", "fpmath", "reference", "launch", "tiers", "kernels", "defaults", "check")
HIGHER = ("cuda", "api", "bench", "device", "prepared", "golden", "verify", "cli", "io", "torch")
FORBIDDEN = {low: HIGHER for low in LOWER}
# The kernels and their launchers: below the public entry points, the golden suite and the CLI.
FORBIDDEN["cuda"] = ("api", "prepared", "golden", "verify", "cli", "torch")
# The public entry points import api; api imports nothing that imports it back, except:
FORBIDDEN["device"] = ("api", "prepared")
# Explicit, documented exceptions: (importer, imported) -> why.
ALLOWED: dict[tuple[str, str], str] = {
    # Same layer (both public entry points; api imports prepared for PreparedActivations):
    # prepare() shares gemv's argument checks, imported when it is called.
    ("prepared", "api"): "same layer: gemv's stream and device-array checks, at call time",
}
FORBIDDEN["prepared"] = ("api",)


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every q2gemv module ``path`` imports (relative to the package), anywhere in the file."""
    mod = _module_name(path)
    is_pkg = path.name == "__init__.py"
    here = mod.split(".") if mod else []
    base = here if is_pkg else here[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "q2gemv" or a.name.startswith("q2gemv."):
                    out.add(a.name.removeprefix("q2gemv").lstrip("."))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if not (node.module or "").startswith("q2gemv"):
                    continue
                target = (node.module or "").removeprefix("q2gemv").lstrip(".")
            else:
                up = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*up, *(node.module.split(".") if node.module else [])])
            out.add(target)
            for a in node.names:  # `from . import cuda` imports the submodule q2gemv.cuda
                out.add(f"{target}.{a.name}".lstrip("."))
    return out


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in PKG.rglob("*.py")}


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_graph_is_parsed():
    g = _graph()
    assert "launch" in g["cuda.q2_0"] and "kernels" in g["launch"]
    assert "cuda.q2_0" in g["device"]  # a function-level import is seen


def test_no_back_edges():
    bad = []
    for mod, targets in sorted(_graph().items()):
        for low, forbidden in FORBIDDEN.items():
            if not _under(mod, low):
                continue
            for t in sorted(targets):
                hit = [f for f in forbidden if _under(t, f)]
                if hit and not any(m == mod and _under(t, a) for m, a in ALLOWED):
                    bad.append(f"{mod} imports {t}")
    assert bad == [], "\n".join(bad)


def test_lower_layers_import_without_numba():
    """Importing every lower layer (in a fresh interpreter) does not load numba."""
    import subprocess
    import sys

    mods = ", ".join(f"q2gemv.{low}" for low in LOWER)
    code = f"import sys, {mods}; assert 'numba' not in sys.modules, 'numba was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)

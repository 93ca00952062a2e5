"""The package's layering, from its import graph (every import, module level or in a function).

Lower layers know nothing of higher ones: the formats, the references, the
registry, the pure geometry and tier logic never import the CUDA kernels, the
API or the benchmark; the kernels never import the API. Where a lower layer
needs something of a higher one, it is injected (``formats._upload``,
``dispatch.nvfp4_tiers.set_default_resolver``). The package has no import circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

from q2gemv.dispatch import registry as kernels

PKG = Path(__file__).resolve().parents[1] / "src" / "q2gemv"

# The layers, bottom to top (docs/architecture.md draws them):
#   tools, dispatch           shared helpers; pure policy (registry, plan, seed rules, NVFP4 tiers)
#   formats                   layouts, weight classes (may read registry constants)
#   reference                 NumPy references (fpmath included)
#   host.backends/.arrays     what this process has; device arrays and streams as passed
#   cuda                      runtime (no family), exact_contract, q2_0/, nvfp4/, ptx
#   host.device/.prepared     device weights, prepared activations (cuda imported lazily)
#   host.operands             a call's activations in their form, looked at once
#   host.call                 the road: one call object, built once, run (cuda imported lazily)
#   api, io                   the calls users make; file readers and writers
#   golden, bench, nn         the golden suite, the benchmark, the torch ops and layers
#   models                    the model level over nn
#   torch, cli, q2gemv        the faces: re-exports and the command
# module (or package prefix) -> prefixes it must never import (not even inside a function)
TOP = ("torch", "cli")
FACES = ("api", "io", "golden", "bench", "nn", "models", *TOP)
ABOVE_CUDA = ("host.device", "host.prepared", "host.operands", "host.call", *FACES)
ABOVE_HOST = ("host", "cuda", *FACES)
FORBIDDEN = {
    "tools": ("dispatch", "formats", "reference", *ABOVE_HOST),
    # dispatch is below host/ and cuda/: pure policy, no numba at module level
    "dispatch": ("formats", "reference", *ABOVE_HOST),
    "formats": ("reference", *ABOVE_HOST),
    "reference": ABOVE_HOST,
    "host.backends": ("host.arrays", "cuda", *ABOVE_CUDA),
    "host.arrays": ("cuda", *ABOVE_CUDA),
    # The kernels and their launchers: below the device weights, the public entry points, the
    # golden suite and the CLI.
    "cuda": ABOVE_CUDA,
    # The public entry points import api; api imports nothing that imports it back.
    "host.device": ("host.prepared", "host.call", *FACES),
    # api imports prepared (PreparedActivations); both take their stream and device-array
    # checks from q2gemv.host.arrays, so prepared never imports api.
    "host.prepared": ("host.operands", "host.call", *FACES),
    # a call's activations in their form (prepared ones included), for the road.
    "host.operands": ("host.call", *FACES),
    # the road (host.call) builds every GEMV over prepared activations and device weights.
    "host.call": FACES,
    "api": ("io", "golden", "bench", "nn", "models", *TOP),
    "io": ("host", "cuda", "api", "golden", "bench", "nn", "models", *TOP),
    "golden": ("bench", "nn", "models", *TOP),
    "bench": ("golden", "nn", "models", *TOP),
    # nn is below models: the layers never reach the model level, which builds on them.
    "nn": ("golden", "bench", "models", *TOP),
    # models import nn (the layers), never q2gemv.torch (the face that re-exports them).
    "models": ("golden", "bench", *TOP),
}
# The runtime under the kernels knows no family: it reaches a family's code through its
# dispatch.registry.FamilySpec (looked up by name), never by importing a family package.
FORBIDDEN["cuda.runtime"] = (
    *FORBIDDEN["cuda"], "cuda.q2_0", "cuda.nvfp4", "cuda.exact_contract", "cuda.ptx",
)  # fmt: skip
# Imported in a fresh interpreter without loading numba (test_lower_layers_import_without_numba).
LOWER = ("tools", "dispatch", "formats", "reference", "host.backends", "host.arrays")
# Explicit, documented exceptions: (importer, imported) -> why. None today.
ALLOWED: dict[tuple[str, str], str] = {}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _statements(path: Path):
    """``(target, names)`` per import of a q2gemv module in ``path`` (module level or in a function).

    ``target`` is relative to the package (``""`` is ``q2gemv`` itself); ``names``
    are the names a ``from`` import takes from it (empty for ``import x``).
    """
    mod = _module_name(path)
    is_pkg = path.name == "__init__.py"
    here = mod.split(".") if mod else []
    base = here if is_pkg else here[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "q2gemv" or a.name.startswith("q2gemv."):
                    yield a.name.removeprefix("q2gemv").lstrip("."), ()
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if not (node.module or "").startswith("q2gemv"):
                    continue
                target = (node.module or "").removeprefix("q2gemv").lstrip(".")
            else:
                up = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*up, *(node.module.split(".") if node.module else [])])
            yield target, tuple(a.name for a in node.names)


def _imports(path: Path) -> set[str]:
    """Every q2gemv module ``path`` imports (relative to the package), anywhere in the file."""
    out: set[str] = set()
    for target, names in _statements(path):
        out.add(target)
        for name in names:  # `from . import cuda` imports the submodule q2gemv.cuda
            out.add(f"{target}.{name}".lstrip("."))
    return out


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in PKG.rglob("*.py")}


def _module_edges() -> dict[str, set[str]]:
    """Module -> the package modules it imports (anywhere in the file), for cycle finding.

    ``from pkg import sub`` is an edge to the module ``pkg.sub``, not to
    ``pkg`` (``from .. import kernels`` depends on ``kernels``, not on the
    package's ``__init__``); ``from pkg import name`` of anything else is an
    edge to ``pkg``.
    """
    paths = {_module_name(p): p for p in PKG.rglob("*.py")}
    edges = {}
    for mod, path in paths.items():
        out = set()
        for target, names in _statements(path):
            subs = {f"{target}.{n}".lstrip(".") for n in names} & paths.keys()
            out |= subs
            if len(subs) < len(names) or not names:
                out.add(target)
        edges[mod] = {t for t in out if t in paths and t != mod}
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_graph_is_parsed():
    g = _graph()
    assert "dispatch.plan" in g["cuda.q2_0.seed"] and "dispatch.registry" in g["dispatch.plan"]
    assert "cuda.runtime.launcher" in g["host.call"]  # a function-level import is seen
    assert "cuda.runtime.launcher" in g["cuda.q2_0.exact"]  # ... and inside a family
    assert "nn.layers" in g["models.quantize"] and "nn.ops" in g["torch"]


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


def _cycle_path(edges: dict[str, set[str]], comp: list[str]) -> list[str]:
    """One circle through the component ``comp``, as ``[a, b, ..., a]`` (each imports the next)."""
    members = set(comp)
    start = comp[0]
    paths = {start: [start]}
    queue = [start]
    while queue:  # breadth first: the shortest way from start back to start
        v = queue.pop(0)
        for w in sorted(edges[v] & members):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    return [*comp, start]


def _cycle_report(edges: dict[str, set[str]]) -> list[str]:
    return [
        f"{', '.join(c)} import each other, e.g. " + " -> ".join(_cycle_path(edges, c))
        for c in _cycles(edges)
    ]


def test_no_import_cycles():
    """No circle of modules importing each other, counting imports inside functions."""
    edges = _module_edges()
    assert {"models.quantize", "nn.layers", "torch"} <= edges.keys()
    report = _cycle_report(edges)
    assert report == [], "import circles (q2gemv.<module>):\n" + "\n".join(report)


def test_the_cycle_finder_sees_function_level_circles():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert _cycle_report(edges) == ["a, b, c import each other, e.g. a -> b -> c -> a"]


def test_runtime_imports_no_family():
    g = _graph()
    runtime = [m for m in g if _under(m, "cuda.runtime")]
    assert {"cuda.runtime.launcher", "cuda.runtime.interop", "cuda.runtime.prebound"} <= set(
        runtime
    )
    bad = [
        f"{m} imports {t}"
        for m in runtime
        for t in sorted(g[m])
        if any(_under(t, f) for f in ("cuda.q2_0", "cuda.nvfp4", "cuda.exact_contract"))
    ]
    assert bad == []


def test_lower_layers_import_without_numba():
    """Importing every lower layer (in a fresh interpreter) does not load numba."""
    import subprocess
    import sys

    mods = ", ".join(f"q2gemv.{low}" for low in LOWER)
    code = f"import sys, {mods}; assert 'numba' not in sys.modules, 'numba was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- dispatch is data: no family string comparisons outside the registry and the formats ------

FAMILY_NAMES = frozenset(kernels.FAMILIES) | {f"{f}_exact" for f in kernels.FAMILIES}
# Where a family may be named in a comparison: the registry states the families, a format
# module its own.
FAMILY_HOME = ("dispatch.registry", "formats")


def _family_valued(node: ast.expr) -> bool:
    """``family``, ``fam``, ``x.family`` or ``x["family"]``: an expression holding a family."""
    if isinstance(node, ast.Name):
        return node.id in ("family", "fam")
    if isinstance(node, ast.Attribute):
        return node.attr == "family"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "family"
    return False


def _names_family(node: ast.expr) -> bool:
    """A string literal naming a family (``"q2_0"``, ``"w4a16_exact"``, ...)."""
    return isinstance(node, ast.Constant) and node.value in FAMILY_NAMES


def _family_comparisons(source: str) -> list[int]:
    """Lines of ``source`` that compare a family: ``==``/``!=``/``is`` with a family literal or
    a family-valued operand, ``in``/``not in`` a literal holding a family name."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        left = node.left
        for op, right in zip(node.ops, node.comparators, strict=True):
            if isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)):
                pair = (left, right)
                if any(_family_valued(x) or _names_family(x) for x in pair):
                    lines.append(node.lineno)
            elif isinstance(op, (ast.In, ast.NotIn)) and isinstance(
                right, (ast.Tuple, ast.List, ast.Set)
            ):
                if _family_valued(left) or any(_names_family(x) for x in right.elts):
                    lines.append(node.lineno)
            left = right
    return sorted(set(lines))


def test_family_comparison_finder_sees_each_form():
    src = "\n".join(
        [
            'a = fmt == "q2_0"',
            "b = s.family == fam",
            'c = r["family"] != "bf16"',
            'd = family in ("x", "y")',
            'e = "w4a16_exact" is k',
            'f = kind in ("w4a16", "z")',
            "g = 1 < n == 2",  # not a family
            'h = r["kind"] == "q3"',  # not a family
            "i = fam in table",  # a lookup in data, not a comparison
        ]
    )
    assert _family_comparisons(src) == [1, 2, 3, 4, 5, 6]


def test_no_family_string_comparisons_outside_the_registry():
    """Dispatch goes through ``kernels.family(...)`` and per-family data (issue 20): no module
    outside ``dispatch/registry.py`` and ``formats/`` decides which family it holds by comparing names."""
    bad = [
        f"{path.relative_to(PKG)}:{line}"
        for path in sorted(PKG.rglob("*.py"))
        if not any(_under(_module_name(path), home) for home in FAMILY_HOME)
        for line in _family_comparisons(path.read_text())
    ]
    assert bad == []

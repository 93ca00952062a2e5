"""Where a format may be named: its own places, the registry, the faces, and listed exceptions.

A new format adds its own files (``formats/<fmt>.py``, ``reference/<fmt>.py``,
``cuda/<fmt>/``, ``nn/<fmt>.py``, ...) and one registry entry
(docs/architecture.md, "A new format"). Everything else reaches a format
through :mod:`q2gemv.dispatch.registry`: outside :data:`FORMAT_PLACES` and
:data:`EXCEPTIONS`, no module imports a format's module, and none spells a
format in its code (an identifier, or a string that is not a docstring).
Comments and docstrings may name formats (examples, messages' documentation).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from q2gemv.dispatch import registry

PKG = Path(__file__).resolve().parents[1] / "src" / "q2gemv"

# Every spelling a format has: its family name, its layer format, and its modules' names.
TOKENS = sorted(
    {f.name for f in registry.families()}
    | {f.layer_format for f in registry.families() if f.layer_format}
)
# A format module: a path part that is a token, or starts with one (q2_0_layout, nvfp4_tiers).
FORMAT_PART = re.compile(rf"^({'|'.join(map(re.escape, TOKENS))})(_|$)")
# In code: an identifier naming a format (Q2Linear, Nvfp4Weight, W4A16_KERNELS, EXACT_Q2_KERNEL;
# not q2gemv, the package), or a string holding a token ("q2_0", "w4a16_gemv_exact", "NVFP4").
IDENT = re.compile(r"(?i)(q2(?!gemv)|nvfp4|w4a16|(^|_)w4(_|$))")
STRING = re.compile(rf"(?i)(?<![a-z0-9])({'|'.join(map(re.escape, TOKENS))})")

# A format's own places, and the places that hold every format's entry by design.
FORMAT_PLACES = {
    "formats": "the one place each layout is stated (formats/<fmt>.py, <fmt>_layout.py)",
    "reference": "the NumPy references: reference/<fmt>.py, and exact.py's per-family entries",
    "cuda.q2_0": "Q2_0's kernels",
    "cuda.nvfp4": "NVFP4's kernels",
    "nn.q2_0": "Q2_0's torch layer (Q2Linear) and what the model level knows of the format",
    "nn.nvfp4": "NVFP4's torch layer (Nvfp4Linear) and what the model level knows of the format",
    "dispatch": "the registry, and the policy tables it names (seed rules, NVFP4 tiers, grids)",
    "io": "external file formats know their tensor types (GGUF type 42 is Q2_0, ModelOpt NVFP4)",
    "golden": "golden tables and cases per format",
    "bench": "byte formulas and cases per format",
}
# The faces (these modules only, not what is under them): public names kept where they are.
FACES = {
    "": "q2gemv: the public names (Q2Weight, quantize_q2_0, ...)",
    "cuda": "q2gemv.cuda: the device weights and the kernels by name",
    "torch": "q2gemv.torch: Q2Linear, Nvfp4Linear, q2_linear, nvfp4_linear, ...",
    "cli": "the command's help and choices",
    "api": "public constants kept under their names (Q2_KERNELS, EXACT_W4_KERNEL, ...)",
}
# Known places that still hold format knowledge outside its own places, each with its reason.
# The list only shrinks: a new entry needs a reason a reviewer accepts.
EXCEPTIONS = {
    "models.gguf": "the GGUF model loader: GGUF files carry Q2_0 / PQ2_0 tensors",
    "models.safetensors": "the safetensors model loader: ModelOpt / compressed-tensors NVFP4",
    "models.export": "the file writers: save_gguf (Q2_0 tensors), save_safetensors (NVFP4)",
}


def _module(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _under(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


def _docstrings(tree: ast.AST) -> set[int]:
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef,
             ast.AsyncFunctionDef, ast.ClassDef)))]  # fmt: skip
    out = set()
    for n in nodes:
        body = getattr(n, "body", [])
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            out.add(id(body[0].value))
    return out


def _imported(node, mod: str, is_pkg: bool) -> list[str]:
    """The package modules an import names, relative to the package."""
    if isinstance(node, ast.Import):
        return [a.name.removeprefix("q2gemv.") for a in node.names if a.name.startswith("q2gemv.")]
    if node.module is None and node.level == 0:
        return []
    if node.level == 0:
        if not node.module.startswith("q2gemv"):
            return []
        base = node.module.removeprefix("q2gemv").lstrip(".")
    else:
        here = mod.split(".") if mod else []
        base_parts = here if is_pkg else here[:-1]
        up = base_parts[: len(base_parts) - (node.level - 1)]
        base = ".".join([*up, *([node.module] if node.module else [])])
    return [f"{base}.{a.name}".lstrip(".") for a in node.names] + [base]


def violations(path: Path, mod: str) -> list[str]:
    """Where ``path`` (module ``mod``) imports a format's module or spells a format in code."""
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        where = f"{mod}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for target in _imported(node, mod, path.name == "__init__.py"):
                if any(FORMAT_PART.match(part) for part in target.split(".")):
                    found.append(f"{where} imports {target}")
            for a in node.names:
                if IDENT.search(a.asname or a.name.rpartition(".")[2]):
                    found.append(f"{where} imports the name {a.asname or a.name}")
        elif isinstance(node, ast.Name) and IDENT.search(node.id):
            found.append(f"{where} names {node.id}")
        elif isinstance(node, ast.Attribute) and IDENT.search(node.attr):
            found.append(f"{where} names .{node.attr}")
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and IDENT.search(node.name):
            found.append(f"{where} defines {node.name}")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docs
            and STRING.search(node.value)
        ):
            found.append(f"{where} spells {node.value!r}")
    return found


def _checked_modules():
    for path in sorted(PKG.rglob("*.py")):
        mod = _module(path)
        if mod in FACES or any(_under(mod, p) for p in (*FORMAT_PLACES, *EXCEPTIONS)):
            continue
        yield path, mod


def test_format_names_stay_in_their_places():
    found = [v for path, mod in _checked_modules() for v in violations(path, mod)]
    assert not found, "a format named outside its places (tests/test_layout.py):\n" + "\n".join(
        found
    )


def test_the_format_free_modules_are_the_road_the_layers_and_the_model_level():
    checked = {mod for _, mod in _checked_modules()}
    for mod in ("host.call", "host.operands", "cuda.runtime.launcher", "nn.layers",
                "nn.swap", "models.quantize", "models.saved", "models.fuse", "models.hf"):  # fmt: skip
        assert mod in checked


def test_the_rule_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        '"""q2_0 in a docstring is fine."""\n'
        "from ..nn.q2_0 import Q2Linear\n"
        "from ..formats import nvfp4_layout\n"
        'FMT = "w4a16"\n'
        "x = isinstance(1, Q2Linear)\n"
        "import q2gemv  # the package's name is no format\n"
    )
    found = violations(bad, "models.bad")
    assert any("imports nn.q2_0" in v for v in found)
    assert any("imports formats.nvfp4_layout" in v for v in found)
    assert any("imports the name Q2Linear" in v for v in found)
    assert any("spells 'w4a16'" in v for v in found)
    assert any("names Q2Linear" in v for v in found)
    assert not any("docstring" in v or "q2gemv" in v for v in found)


def test_every_exception_still_needs_its_entry():
    """An exception whose module no longer names a format is struck from the list."""
    paths = {_module(p): p for p in PKG.rglob("*.py")}
    stale = [mod for mod in EXCEPTIONS if not violations(paths[mod], mod)]
    assert not stale, f"no longer exceptions (remove them from EXCEPTIONS): {stale}"

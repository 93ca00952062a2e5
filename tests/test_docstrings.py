"""Every public name has a docstring, and public functions' docstrings mention their arguments.

Public means: the names in ``q2gemv.__all__``, ``q2gemv.reference.__all__``
and ``q2gemv.io.__all__``, and the public (non-underscore) functions and
classes defined in ``q2gemv.dispatch.nvfp4_tiers``, ``q2gemv.dispatch.plan`` and every
``q2gemv.formats`` module, together with their public methods. A docstring is
"non-trivial" when it has at least :data:`MIN_WORDS` words. An argument counts
as mentioned when its name appears in the docstring of the function (or, for
a class, of the class or its ``__init__``/constructor); dataclass fields are
described in the class docstring.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

MIN_WORDS = 4
# Arguments whose meaning is conventional and need not be spelled out.
EXEMPT_ARGS = {"self", "cls", "args", "kwargs"}

EXPORTING_MODULES = ("q2gemv", "q2gemv.reference", "q2gemv.io")
DEFINING_MODULES = (
    "q2gemv.dispatch.nvfp4_tiers",
    "q2gemv.dispatch.registry",
    "q2gemv.dispatch.seed_rules",
    "q2gemv.host.arrays",
    "q2gemv.dispatch.plan",
    "q2gemv.formats.q2_0",
    "q2gemv.formats.nvfp4",
    "q2gemv.formats.bf16",
)


def _exported() -> list[tuple[str, object]]:
    out = []
    for modname in EXPORTING_MODULES:
        mod = importlib.import_module(modname)
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                out.append((f"{modname}.{name}", obj))
    return out


def _defined() -> list[tuple[str, object]]:
    out = []
    for modname in DEFINING_MODULES:
        mod = importlib.import_module(modname)
        for name, obj in vars(mod).items():
            if name.startswith("_"):
                continue
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == modname:
                out.append((f"{modname}.{name}", obj))
    return out


def _methods(qual: str, cls: type) -> list[tuple[str, object]]:
    out = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, (classmethod, staticmethod)):
            member = member.__func__
        elif isinstance(member, property):
            member = member.fget
        if inspect.isfunction(member):
            out.append((f"{qual}.{name}", member))
    return out


def public_objects() -> list[tuple[str, object]]:
    seen: dict[int, tuple[str, object]] = {}
    for qual, obj in _exported() + _defined():
        seen.setdefault(id(obj), (qual, obj))
    items = list(seen.values())
    for qual, obj in list(items):
        if inspect.isclass(obj) and obj.__module__.startswith("q2gemv"):
            items.extend(_methods(qual, obj))
    return sorted(items, key=lambda t: t[0])


PUBLIC = public_objects()
FUNCTIONS = [(q, o) for q, o in PUBLIC if inspect.isfunction(o)]

# Known gaps in modules this test's author does not own, reported to the lead
# (see the notebooks-and-docs report). strict xfail: when a gap is fixed the
# test XPASSes and fails, so the entry must be removed here. Never add to
# these lists to get green; fix the docstring instead.
KNOWN_MISSING_DOCSTRING: frozenset[str] = frozenset()
KNOWN_UNMENTIONED_ARGS: frozenset[str] = frozenset()


def _params(items, known):
    return [
        pytest.param(q, o, id=q, marks=pytest.mark.xfail(strict=True, reason="known docstring gap"))
        if q in known
        else pytest.param(q, o, id=q)
        for q, o in items
    ]


def _own_doc(obj) -> str:
    # inspect.getdoc would inherit a base class's docstring; a name must carry its own.
    return inspect.cleandoc(obj.__doc__ or "")


def test_known_gaps_are_public_names():
    names = {q for q, _ in PUBLIC}
    assert not (KNOWN_MISSING_DOCSTRING | KNOWN_UNMENTIONED_ARGS) - names


def test_public_names_found():
    names = {q for q, _ in PUBLIC}
    for must in ("q2gemv.gemv", "q2gemv.reference.q2_0_gemv_vec", "q2gemv.load_q2_weights"):
        assert must in names
    assert len(PUBLIC) > 40


@pytest.mark.parametrize("qual,obj", _params(PUBLIC, KNOWN_MISSING_DOCSTRING))
def test_has_docstring(qual, obj):
    doc = _own_doc(obj)
    words = re.findall(r"\w+", doc)
    assert len(words) >= MIN_WORDS, f"{qual}: docstring missing or trivial ({doc!r})"


def _arg_names(fn) -> list[str]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [
        p.name
        for p in sig.parameters.values()
        if p.name not in EXEMPT_ARGS
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]


@pytest.mark.parametrize("qual,fn", _params(FUNCTIONS, KNOWN_UNMENTIONED_ARGS))
def test_docstring_mentions_arguments(qual, fn):
    doc = _own_doc(fn)
    missing = [a for a in _arg_names(fn) if not re.search(rf"\b{re.escape(a)}\b", doc)]
    assert not missing, f"{qual}: docstring does not mention argument(s) {missing}"


# -- the README, which CI runs from its first code block ---------------------------------

README = Path(__file__).resolve().parent.parent / "README.md"
TEST_COMMAND = "python -m pytest -q -n auto --dist worksteal --durations=15"
FIRST_COMMANDS = f'pip install -e ".[test]" && q2gemv verify\n{TEST_COMMAND}\n'


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    first = re.search(r"```(?:bash|sh)?\n(.*?)```", text, re.S)
    assert first is not None and first.group(1) == FIRST_COMMANDS


def test_ci_runs_the_readme_test_command():
    ci = (README.parent / ".ci" / "run").read_text().splitlines()
    assert TEST_COMMAND in [line.split("#")[0].strip() for line in ci]


def test_docs_name_every_kernel_switch_and_placeholder():
    from q2gemv.api import Q2_KERNELS, W4A16_KERNELS
    from q2gemv.dispatch import nvfp4_tiers as tiers

    docs = README.parent / "docs"
    wanted = {
        # the README is the front page: it links the pages that hold the rest
        README: ["docs/architecture.md", "docs/kernels.md", "docs/benchmarks.md", "q2gemv.explain"],
        docs / "kernels.md": [
            *Q2_KERNELS,
            *W4A16_KERNELS,
            *tiers.ENV_NO_EXACT_M,
            *tiers.ENV_NO_BATCH8_RT,
            "q2gemv.explain",
        ],
        docs / "benchmarks.md": ["<!-- bench-summary -->"],
    }
    for path, names in wanted.items():
        text = path.read_text()
        missing = [n for n in names if n not in text]
        assert not missing, f"{path.name} does not mention {missing}"

"""The golden suite as loaded from disk: files, cases, and which checks a selection picks.

Files: :func:`expected_files` (one ``gemv_<family>.npz`` per family of
:data:`q2gemv.golden.gen.FAMILY_KERNELS`), checked against ``data/manifest.json``
both ways. A GEMV case is checked once per kernel it lists, in a size class
``small``, ``medium`` or ``large``. The files and the classes: docs/commands.md#the-golden-files.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import gen, store

SIZES = ("small", "medium", "large")
TABLE_FILES = {
    "q2_0": "table_q2_0.json",
    "e2m1": "table_e2m1.json",
    "e4m3": "table_e4m3.json",
    "bf16": "table_bf16.json",
}
GGML_FILE = "ggml_q2_0_reference_vectors.npz"
ROUNDTRIP_FILE = "roundtrip.npz"
MODEL_FILE = "model_5120.npz"
# Data files that are not golden files (documentation beside the data).
NON_GOLDEN_SUFFIXES = (".md",)


def gemv_files() -> dict[str, str]:
    """GEMV set -> file: one ``gemv_<family>.npz`` per family of ``gen.FAMILY_KERNELS``, + model.

    Read from the generator at call time, so a family added there is expected
    here (and by ``verify`` and ``regen``) with no other edit.
    """
    return {fam: f"gemv_{fam}.npz" for fam in gen.FAMILY_KERNELS} | {"model": MODEL_FILE}


def expected_files() -> dict[str, str]:
    """Every golden file this suite needs -> its set: the one list the integrity check uses."""
    return (
        {f: "tables" for f in TABLE_FILES.values()}
        | {GGML_FILE: "ggml", ROUNDTRIP_FILE: "roundtrip"}
        | {f: s for s, f in gemv_files().items()}
    )


def sets() -> tuple[str, ...]:
    """Set names, in suite order (``tables``, ``ggml``, ``roundtrip``, one per family, ``model``)."""
    return tuple(dict.fromkeys(expected_files().values()))


# Snapshots of the functions above at import (kept for callers that want constants).
GEMV_FILES = gemv_files()
FILE_SET = expected_files()
SETS = sets()


@dataclass
class GemvCase:
    """One GEMV case: inputs (stored, or rebuilt from the generator) and expected bits per kernel."""

    spec: gen.GemvSpec
    file: str
    want_keys: dict[str, str]
    input_keys: dict[str, str] | None  # None: rebuilt from spec (model shapes)
    inputs_sha256: str
    arrays: dict[str, np.ndarray] = field(repr=False)
    _inputs: dict[str, np.ndarray] | None = field(default=None, repr=False)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def set(self) -> str:
        return expected_files()[self.file]

    @property
    def family(self) -> str:
        return self.spec.family

    @property
    def kernels(self) -> tuple[str, ...]:
        return tuple(self.want_keys)

    def size_of(self, kernel: str) -> str:
        return self.spec.size_of(kernel)

    def inputs(self) -> dict[str, np.ndarray]:
        """The input arrays; rebuilt ones are checked against the stored sha256 first."""
        if self._inputs is None:
            if self.input_keys is not None:
                self._inputs = {k: self.arrays["in/" + v] for k, v in self.input_keys.items()}
            else:
                x = gen.build_inputs(self.spec)
                got = gen.inputs_sha256(x)
                if got != self.inputs_sha256:
                    raise store.GoldenError(
                        f"{self.id}: the regenerated inputs hash to {got[:16]}..., the golden "
                        f"file {self.file} recorded {self.inputs_sha256[:16]}...: the input "
                        f"generator (q2gemv.golden.gen v{gen.GENERATOR_VERSION}) drifted"
                    )
                self._inputs = x
        return self._inputs

    def a_bits(self) -> np.ndarray:
        return self.inputs()["a"]

    def weight(self):
        """The host weight: a Q2Weight or an Nvfp4Weight."""
        return gen.host_weight(self.spec, self.inputs())

    def want(self, kernel: str) -> np.ndarray:
        return self.arrays["want/" + self.want_keys[kernel]]

    def release(self) -> None:
        """Drop rebuilt inputs (the 5120-wide weights are tens of MB)."""
        if self.input_keys is None:
            self._inputs = None


@dataclass
class HostCase:
    """A format case checked by host (NumPy) code only: a table, ggml's vectors, a round trip."""

    id: str
    file: str
    payload: object = field(repr=False)

    @property
    def set(self) -> str:
        return expected_files()[self.file]


@dataclass
class Suite:
    data_dir: Path
    manifest: dict
    problems: list[str]  # files that failed their manifest check (never loaded)
    gemv: list[GemvCase]
    host: list[HostCase]

    def gemv_case(self, case_id: str) -> GemvCase:
        for c in self.gemv:
            if c.id == case_id:
                return c
        raise KeyError(f"no GEMV case {case_id!r} in {self.data_dir}")


def load_gemv_file(data_dir: Path, name: str) -> list[GemvCase]:
    arrays = store.read_npz(Path(data_dir) / name)
    try:
        meta = store.meta_from_array(arrays.pop("__meta__"))
    except (KeyError, ValueError) as e:
        raise store.GoldenError(f"golden file {name} has no readable metadata ({e})") from None
    cases = []
    for c in meta["cases"]:
        spec = gen.GemvSpec(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in c["spec"].items()}
        )
        cases.append(GemvCase(spec, name, c["want"], c.get("inputs"), c["inputs_sha256"], arrays))
    return cases


def integrity_problems(data_dir: Path, man: dict) -> dict[str, str]:
    """{file: what is wrong} for the golden data of ``data_dir`` (empty: all intact).

    Checked both ways against :func:`expected_files`: a file the suite needs
    but the manifest does not list, a manifest entry for a file the suite does
    not know, a golden-looking file on disk (``.npz``/``.json``) that is not
    part of the suite, and each listed file's presence, size and sha256
    (:func:`q2gemv.golden.store.file_problem`).
    """
    data_dir = Path(data_dir)
    expected = expected_files()
    out: dict[str, str] = {}
    for name in sorted(expected):
        if name not in man["files"]:
            out[name] = (
                f"golden file {name} is not listed in {store.MANIFEST} (entry removed?); "
                f"it is not used"
            )
    for name in sorted(man["files"]):
        if name not in expected:
            out[name] = (
                f"{store.MANIFEST} lists {name}, which is not a golden file of this suite "
                f"(expected only {', '.join(sorted(expected))})"
            )
    try:
        on_disk = sorted(p.name for p in data_dir.iterdir() if p.name != store.MANIFEST)
    except OSError as e:
        raise store.GoldenError(f"golden data directory {data_dir}: {e.strerror}") from None
    for name in on_disk:
        if name not in expected and name not in out and not name.endswith(NON_GOLDEN_SUFFIXES):
            out[name] = f"unexpected file {name} in {data_dir}: not a golden file of this suite"
    for name in sorted(set(expected) & set(man["files"])):
        p = store.file_problem(data_dir, name, man["files"][name])
        if p:
            out[name] = p
    return out


def load_suite(data_dir: Path | str | None = None, *, strict: bool = False) -> Suite:
    """Load every golden file that passes the integrity check (:func:`integrity_problems`).

    Problems (a file missing, modified, truncated, unlisted or unexpected)
    are listed in ``Suite.problems`` and the files concerned are not read;
    ``strict=True`` raises :class:`~q2gemv.golden.store.GoldenIntegrityError`
    instead. An unreadable or malformed manifest raises
    :class:`~q2gemv.golden.store.GoldenError`.
    """
    data_dir = Path(data_dir) if data_dir is not None else store.default_data_dir()
    man = store.read_manifest(data_dir)
    fmt = man.get("format_version")
    if fmt != gen.FORMAT_VERSION:
        raise store.GoldenError(
            f"golden manifest {data_dir / store.MANIFEST}: format version {fmt!r}, this q2gemv "
            f"reads version {gen.FORMAT_VERSION}"
        )
    bad = integrity_problems(data_dir, man)
    problems = list(bad.values())
    if strict and problems:
        raise store.GoldenIntegrityError(problems)
    gemv: list[GemvCase] = []
    host: list[HostCase] = []
    gemv_names = set(gemv_files().values())
    for name in expected_files():
        if name in bad:
            continue
        try:
            if name in TABLE_FILES.values():
                table = json.loads((data_dir / name).read_text(encoding="utf-8"))
                key = next(k for k, f in TABLE_FILES.items() if f == name)
                host.append(HostCase("tables/" + key, name, table))
            elif name == GGML_FILE:
                host.append(
                    HostCase("ggml/q2_0_reference_vectors", name, store.read_npz(data_dir / name))
                )
            elif name == ROUNDTRIP_FILE:
                arrays = store.read_npz(data_dir / name)
                meta = store.meta_from_array(arrays.pop("__meta__"))
                for c in meta["cases"]:
                    host.append(HostCase(c["spec"]["id"], name, (c, arrays)))
            elif name in gemv_names:
                gemv.extend(load_gemv_file(data_dir, name))
        except (store.GoldenError, KeyError, ValueError, TypeError) as e:
            problems.append(f"golden file {name} cannot be used: {e}")
            if strict:
                raise store.GoldenIntegrityError(problems) from None
    return Suite(data_dir, man, problems, gemv, host)


# -- selection ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """Which checks to run: sets/globs (empty = everything), sizes, kernels (empty = all)."""

    patterns: tuple[str, ...] = ()
    sizes: tuple[str, ...] = SIZES
    kernels: tuple[str, ...] = ()

    @classmethod
    def parse(cls, cases: list[str] | None, kernels: list[str] | None = None) -> Selection:
        """``cases`` tokens: ``all``, a size (small/medium/large), a set name, or an id glob."""
        pats, sizes = [], []
        for tok in cases or ["all"]:
            for t in tok.split(","):
                t = t.strip()
                if not t or t == "all":
                    continue
                if t in SIZES:
                    sizes.append(t)
                else:
                    pats.append(t)
        unknown = [k for k in kernels or () if k not in gen.KERNELS]
        if unknown:
            raise ValueError(f"--kernel: unknown {unknown}; expected some of {list(gen.KERNELS)}")
        return cls(tuple(pats), tuple(sizes) or SIZES, tuple(kernels or ()))

    def case_matches(self, case_id: str, set_name: str) -> bool:
        if not self.patterns:
            return True
        return any(p == set_name or fnmatch.fnmatchcase(case_id, p) for p in self.patterns)

    def gemv_checks(self, suite: Suite) -> list[tuple[GemvCase, str]]:
        out = []
        for c in suite.gemv:
            if not self.case_matches(c.id, c.set):
                continue
            for k in c.kernels:
                if (not self.kernels or k in self.kernels) and c.size_of(k) in self.sizes:
                    out.append((c, k))
        return out

    def host_cases(self, suite: Suite) -> list[HostCase]:
        if "small" not in self.sizes:
            return []
        return [h for h in suite.host if self.case_matches(h.id, h.set)]

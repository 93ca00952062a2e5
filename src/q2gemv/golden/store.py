"""Golden data on disk: the manifest, integrity checks, and deterministic .npz files.

``data/manifest.json`` lists every golden file with its sha256 and byte size,
the data format version and the generator's version and parameters::

    {"format_version": 1,
     "generator": {"module": "q2gemv.golden.gen", "version": 1, ...},
     "files": {"gemv_q2_0.npz": {"sha256": "...", "bytes": 123, "kind": "generated",
                                 "cases": 78, "params": {...}},
               "table_bf16.json": {"sha256": "...", "bytes": 456, "kind": "hand-written"},
               ...}}

:func:`read_manifest` refuses a manifest it cannot use (one-line
:class:`GoldenError`), :func:`file_problem` checks one listed file (present,
size, sha256), and :func:`q2gemv.golden.suite.integrity_problems` checks the
manifest against the files the suite expects, both ways; loading never reads
a file that has not passed.

``.npz`` files are written by :func:`write_npz`: a zip with a fixed
timestamp, entries in sorted order, deflate-compressed ``.npy`` arrays, so
the same arrays give the same bytes (and the same sha256) on every run.
Object arrays are never stored (``np.load(..., allow_pickle=False)``).
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from importlib import resources
from pathlib import Path

import numpy as np

from ..tools import atomic as _atomic

MANIFEST = "manifest.json"
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
_HEX = frozenset("0123456789abcdef")


class GoldenError(Exception):
    """A golden file cannot be used (missing, modified, truncated or unreadable)."""


class GoldenIntegrityError(GoldenError):
    """A golden file does not match its manifest entry."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


def default_data_dir() -> Path:
    """The golden data shipped inside the package."""
    return Path(str(resources.files("q2gemv.golden") / "data"))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(data_dir: Path) -> dict:
    """The manifest of ``data_dir``, checked for shape; :class:`GoldenError` (one line) if unusable.

    Unusable: ``data_dir`` not a directory, the manifest missing, unreadable,
    not UTF-8, not JSON, or not ``{"files": {name: {"sha256": 64 hex digits,
    "bytes": int >= 0, ...}}}`` (``generator``, when present, an object).
    """
    data_dir = Path(data_dir)
    path = data_dir / MANIFEST
    if not data_dir.is_dir():
        what = "does not exist" if not data_dir.exists() else "is not a directory"
        raise GoldenError(f"golden data directory {data_dir} {what}")
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise GoldenError(f"golden manifest {path} is missing") from None
    except OSError as e:
        raise GoldenError(f"golden manifest {path} cannot be read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise GoldenError(f"golden manifest {path} is not UTF-8 ({e.reason})") from None
    try:
        man = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise GoldenError(f"golden manifest {path} is not valid JSON ({e})") from None
    if not isinstance(man, dict) or not isinstance(man.get("files"), dict):
        raise GoldenError(f"golden manifest {path} has no 'files' table")
    if not isinstance(man.get("generator", {}), dict):
        raise GoldenError(f"golden manifest {path}: 'generator' is not an object")
    for name, entry in man["files"].items():
        problem = entry_problem(entry)
        if problem:
            raise GoldenError(f"golden manifest {path}: entry {name!r} {problem}")
    return man


def entry_problem(entry) -> str | None:
    """What is wrong with the shape of one manifest entry (None: an object with sha256 and bytes)."""
    if not isinstance(entry, dict):
        return f"is a JSON {_json_type(entry)}, expected an object with sha256 and bytes"
    sha, size = entry.get("sha256"), entry.get("bytes")
    if not (isinstance(sha, str) and len(sha) == 64 and all(c in _HEX for c in sha)):
        return f"has sha256 {sha!r}, expected 64 lowercase hex digits"
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        return f"has bytes {size!r}, expected an integer >= 0"
    return None


def _json_type(x) -> str:
    names = {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string"}
    return names.get(type(x), "array" if isinstance(x, list) else type(x).__name__)


def write_manifest(data_dir: Path, man: dict) -> None:
    """Write the manifest atomically (a temporary file renamed over the old one)."""
    text = json.dumps(man, indent=1, sort_keys=True) + "\n"
    write_atomic(Path(data_dir) / MANIFEST, text.encode("utf-8"))


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, then rename.

    :func:`q2gemv.tools.atomic.write_bytes` (fsync'd; the temporary file removed on failure).
    """
    _atomic.write_bytes(path, data)


def file_problem(data_dir: Path, name: str, entry: dict) -> str | None:
    """What is wrong with golden file ``name`` against its manifest ``entry`` (None: intact)."""
    path = Path(data_dir) / name
    if not path.is_file():
        return f"golden file {name} is missing from {data_dir}"
    shape = entry_problem(entry)
    if shape:
        return f"the manifest entry of golden file {name} {shape}; it is not used"
    want_size = entry["bytes"]
    try:
        size = path.stat().st_size
        got = sha256_file(path) if size == want_size else ""
    except OSError as e:
        return f"golden file {name} cannot be read ({e.strerror}); it is not used"
    if size != want_size:
        what = "truncated" if size < want_size else "grown"
        return (
            f"golden file {name} is {size} bytes, the manifest says {want_size} "
            f"({what} or replaced); it is not used"
        )
    if got != entry["sha256"]:
        return (
            f"golden file {name} was modified: sha256 {got[:16]}... does not match the "
            f"manifest's {entry['sha256'][:16]}...; it is not used"
        )
    return None


def file_problems(data_dir: Path, man: dict | None = None) -> dict[str, str]:
    """{file: what is wrong} for the golden files of ``data_dir`` (empty: all intact)."""
    man = read_manifest(data_dir) if man is None else man
    out = {}
    for name, entry in sorted(man["files"].items()):
        p = file_problem(data_dir, name, entry)
        if p:
            out[name] = p
    return out


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """The bytes of a deterministic compressed .npz (fixed timestamps, sorted entries)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for key in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[key]), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue(), compresslevel=9)
    return out.getvalue()


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Deterministic compressed .npz (fixed timestamps, sorted entries), written atomically."""
    write_atomic(Path(path), npz_bytes(arrays))


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of an .npz (no pickles), as a dict; raises GoldenError naming the file."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise GoldenError(f"golden file {Path(path).name} cannot be read: {e}") from None


def meta_to_array(meta: dict) -> np.ndarray:
    """JSON metadata stored inside an .npz as uint8 UTF-8 bytes (no pickle needed)."""
    return np.frombuffer(json.dumps(meta, sort_keys=True).encode("utf-8"), np.uint8)


def meta_from_array(a: np.ndarray) -> dict:
    return json.loads(bytes(np.asarray(a, np.uint8)).decode("utf-8"))


def content_key(a: np.ndarray) -> str:
    """Content address of an array (dtype, shape and bytes): identical arrays are stored once."""
    a = np.ascontiguousarray(a)
    h = hashlib.sha256(f"{a.dtype.str}|{a.shape}|".encode())
    h.update(a.tobytes())
    return h.hexdigest()[:16]

"""``q2gemv golden regen``: rebuild the generated golden files from the NumPy references.

Inputs come from :mod:`q2gemv.golden.gen` (deterministic), expectations
from the references (:mod:`q2gemv.reference`) and, for the round trips, the
format modules. The new files are compared with the existing ones case by
case; an existing expectation (or input) that would change, or a case that
would disappear, makes regen refuse unless ``force`` is set, after printing
what changed. New cases are simply added. Hand-written and external files
are never rewritten: their manifest entry is (re)recorded, and a changed
one needs ``force`` too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from pathlib import Path

import numpy as np

from . import gen, host, store
from .harness import Runner
from .report import result_from_bits
from .suite import (
    GGML_FILE,
    MODEL_FILE,
    ROUNDTRIP_FILE,
    SETS,
    TABLE_FILES,
    GemvCase,
    expected_files,
    gemv_files,
)
from .suite import sets as suite_sets

FIRST_DIFFS = 3


def _gemv_params(specs: list[gen.GemvSpec]) -> dict:
    return {
        "generator": f"q2gemv.golden.gen v{gen.GENERATOR_VERSION}",
        "cases": len(specs),
        "checks": sum(len(s.kernels) for s in specs),
        "small_checks": sum(len(s.small) for s in specs),
        "n": sorted({s.n for s in specs}),
        "k": sorted({s.k for s in specs}),
        "m": sorted({s.m for s in specs}),
        "groups": sorted({s.group for s in specs if s.group}),
        "weight_kinds": sorted({s.weight_kind for s in specs}),
        "act_kinds": sorted({s.act_kind for s in specs}),
        "kernels": sorted({k for s in specs for k in s.kernels}),
    }


def build_gemv_file(specs: list[gen.GemvSpec], file: str, store_inputs: bool) -> dict:
    """Arrays of one GEMV golden file: ``__meta__``, ``in/<key>``, ``want/<key>`` (uint16 bits)."""
    arrays: dict[str, np.ndarray] = {}
    cases = []
    runner = Runner("reference")
    for spec in specs:
        x = gen.build_inputs(spec)
        sha = gen.inputs_sha256(x)
        case = GemvCase(spec, file, {}, None, sha, {}, x)
        entry: dict = {"spec": dataclasses.asdict(spec), "inputs_sha256": sha, "want": {}}
        if store_inputs:
            entry["inputs"] = {}
            for name, arr in x.items():
                key = store.content_key(arr)
                arrays["in/" + key] = arr
                entry["inputs"][name] = key
        for kernel in spec.kernels:
            y = np.ascontiguousarray(runner(case, kernel), np.uint16)
            key = store.content_key(y)
            arrays["want/" + key] = y
            entry["want"][kernel] = key
        cases.append(entry)
    runner.close()
    meta = {
        "format_version": gen.FORMAT_VERSION,
        "generator_version": gen.GENERATOR_VERSION,
        "file": file,
        "params": _gemv_params(specs),
        "inputs": "stored" if store_inputs else "rebuilt from the generator, checked by sha256",
        "cases": cases,
    }
    arrays["__meta__"] = store.meta_to_array(meta)
    return arrays


def build_roundtrip_file() -> dict:
    arrays: dict[str, np.ndarray] = {}
    cases = []
    specs = gen.roundtrip_specs()
    for spec in specs:
        x = gen.roundtrip_inputs(spec)
        want = host.roundtrip_expect(spec, x)
        entry: dict = {"spec": dataclasses.asdict(spec), "inputs": {}, "want": {}}
        for part, src in (("inputs", x), ("want", want)):
            for name, arr in src.items():
                key = store.content_key(arr)
                arrays[("in/" if part == "inputs" else "want/") + key] = arr
                entry[part][name] = key
        cases.append(entry)
    meta = {
        "format_version": gen.FORMAT_VERSION,
        "generator_version": gen.GENERATOR_VERSION,
        "file": ROUNDTRIP_FILE,
        "params": {
            "generator": f"q2gemv.golden.gen v{gen.GENERATOR_VERSION}",
            "cases": len(specs),
            "shapes": {s.id: [s.n, s.k] for s in specs},
            "dequant": "fp32 bits, every NaN stored as 0x7FC00000",
        },
        "cases": cases,
    }
    arrays["__meta__"] = store.meta_to_array(meta)
    return arrays


def build(file: str) -> dict:
    """Arrays of generated golden file ``file``."""
    if file == ROUNDTRIP_FILE:
        return build_roundtrip_file()
    if file == MODEL_FILE:
        return build_gemv_file(gen.model_specs(), file, store_inputs=False)
    fam = next(s for s, f in gemv_files().items() if f == file)
    by_family: dict[str, list[gen.GemvSpec]] = {}
    for s in gen.gemv_specs():
        by_family.setdefault(s.family, []).append(s)
    return build_gemv_file(by_family.get(fam, []), file, True)


FIXED = tuple(TABLE_FILES.values()) + (GGML_FILE,)  # hand-written / external: never rewritten


def generated_files() -> tuple[str, ...]:
    """The files regen builds: every expected file that is not hand-written or external."""
    return tuple(f for f in expected_files() if f not in FIXED)


# -- diffs -----------------------------------------------------------------------------------


def _cases_by_id(arrays: dict) -> dict[str, dict]:
    meta = store.meta_from_array(arrays["__meta__"])
    return {c["spec"]["id"]: c for c in meta["cases"]}


def _first_diffs(old: np.ndarray, new: np.ndarray) -> str:
    if old.shape != new.shape or old.dtype != new.dtype:
        return f"{old.dtype}{old.shape} -> {new.dtype}{new.shape}"
    r = result_from_bits("", "", "", new, old)  # got = new, want = old
    parts = [
        f"(row {row}, col {col}) old 0x{w:0{r.width}X} new 0x{g:0{r.width}X}"
        for row, col, g, w in r.first[:FIRST_DIFFS]
    ]
    return f"{r.mismatches} of {r.elements} elements differ; first: " + ", ".join(parts)


def diff_generated(old: dict | None, new: dict) -> tuple[list[str], list[str], int, int]:
    """(changes, additions, unchanged cases, total new cases) between two files' arrays.

    A change is an existing expectation or stored input whose bits differ, an
    input sha256 that differs, or an existing case/expectation that is gone.
    """
    new_cases = _cases_by_id(new)
    if old is None:
        return [], [f"{cid}: new" for cid in new_cases], 0, len(new_cases)
    old_cases = _cases_by_id(old)
    changes, adds, same = [], [], 0
    for cid, nc in new_cases.items():
        oc = old_cases.get(cid)
        if oc is None:
            adds.append(f"{cid}: new")
            continue
        before = len(changes)
        if oc.get("inputs_sha256") != nc.get("inputs_sha256"):
            changes.append(f"{cid}: inputs changed (generator drift?)")
        for name, key in (nc.get("inputs") or {}).items():
            okey = (oc.get("inputs") or {}).get(name)
            if okey is None:
                continue
            a, b = old["in/" + okey], new["in/" + key]
            if a.shape != b.shape or not np.array_equal(a, b):
                changes.append(f"{cid}: input {name}: {_first_diffs(a, b)}")
        for kernel, key in nc["want"].items():
            okey = oc["want"].get(kernel)
            if okey is None:
                adds.append(f"{cid} {kernel}: new expectation")
                continue
            a, b = old["want/" + okey], new["want/" + key]
            if a.shape != b.shape or not np.array_equal(a, b):
                changes.append(f"{cid} {kernel}: {_first_diffs(a, b)}")
        for kernel in oc["want"]:
            if kernel not in nc["want"]:
                changes.append(f"{cid} {kernel}: expectation removed")
        same += len(changes) == before
    for cid in old_cases:
        if cid not in new_cases:
            changes.append(f"{cid}: case removed")
    return changes, adds, same, len(new_cases)


def _meta_changes(old: dict | None, new: dict) -> str:
    """'' when the metadata is the same, else what changed (never needs --force)."""
    if old is None:
        return ""
    om, nm = (store.meta_from_array(x["__meta__"]) for x in (old, new))
    oc, nc = ({c["spec"]["id"]: c["spec"] for c in m["cases"]} for m in (om, nm))
    n = sum(1 for cid, spec in nc.items() if cid in oc and oc[cid] != spec)
    parts = [f"{n} case(s)"] if n else []
    if {k: v for k, v in om.items() if k != "cases"} != {
        k: v for k, v in nm.items() if k != "cases"
    }:
        parts.append("the file header")
    return " and ".join(parts)


# -- the command --------------------------------------------------------------------------------


def regen(
    data_dir: Path | None = None,
    *,
    force: bool = False,
    sets: tuple[str, ...] = (),
    dry_run: bool = False,
    out=None,
) -> int:
    """Regenerate; print what changed; 0 when written (or nothing to do), 1 when refused.

    Without a valid manifest nothing can be compared, so regen refuses unless
    ``force``; the manifest it writes always lists every file of
    :func:`~q2gemv.golden.suite.expected_files` (it refuses rather than drop
    one, e.g. ``--sets`` with a manifest that lacks another set's entry).
    An I/O error is one line on ``out`` and status 1.
    """
    from ..tools.command import one_line

    err = sys.stderr if out is None else out  # refusals and errors: stderr on the command line
    out = sys.stdout if out is None else out
    data_dir = Path(data_dir) if data_dir is not None else store.default_data_dir()
    known_sets = suite_sets()
    unknown = [s for s in sets if s not in known_sets]
    if unknown:
        print(
            f"golden regen: unknown set(s) {unknown}; expected some of {list(known_sets)}",
            file=err,
        )
        return 1
    try:
        man = store.read_manifest(data_dir)
    except store.GoldenError as e:
        if not force:
            print(
                f"golden regen: refused: {one_line(e)}; without a valid manifest regen cannot "
                f"tell which expectations would change. Rerun with --force to rebuild every file "
                f"(hand-written and external files are then recorded as they are on disk).",
                file=err,
            )
            return 1
        print(f"golden regen: {e}; --force: rebuilding the manifest from scratch", file=out)
        man = {"files": {}}
    expected = expected_files()
    new_man = {
        "format_version": gen.FORMAT_VERSION,
        "package": "q2gemv",
        "generator": {
            "module": "q2gemv.golden.gen",
            "version": gen.GENERATOR_VERSION,
            "rng": "SplitMix64 counter stream per label; seed = sha256(label)[:8] little-endian",
        },
        "files": dict(man["files"]),
    }
    for file in sorted(set(new_man["files"]) - set(expected)):
        print(
            f"{file}: dropped from the manifest (no longer a golden file of this suite)", file=out
        )
        del new_man["files"][file]
    if _refuse_unlisted(expected, new_man, sets, err, planned=True):
        return 1
    refusals = 0
    writes: dict[str, bytes] = {}
    for file in FIXED + generated_files():
        if sets and expected[file] not in sets:
            continue
        entry = man["files"].get(file)
        path = data_dir / file
        if file in FIXED:
            if not path.is_file():
                print(f"{file}: missing (hand-written/external: regen cannot make it)", file=out)
                refusals += 1
                continue
            rec = {
                "sha256": store.sha256_file(path),
                "bytes": path.stat().st_size,
                "kind": "external" if file == GGML_FILE else "hand-written",
            }
            if file == GGML_FILE:
                rec["provenance"] = "PROVENANCE.md"
            if entry is None:
                print(
                    f"{file}: not in the manifest; recording it as it is on disk needs a review "
                    f"({rec['kind']}), then --force",
                    file=out,
                )
                if not force:
                    refusals += 1
                    continue
            elif entry.get("sha256") != rec["sha256"]:
                print(
                    f"{file}: CHANGED on disk since the manifest was written "
                    f"({entry.get('bytes')} -> {rec['bytes']} bytes); it is "
                    f"{rec['kind']}: review it, then --force to accept",
                    file=out,
                )
                if not force:
                    refusals += 1
                    continue
            else:
                print(f"{file}: unchanged", file=out)
            new_man["files"][file] = rec
            continue
        new = build(file)
        old = None
        if entry is not None:
            problem = store.file_problem(data_dir, file, entry)
            if problem:
                print(f"{file}: the existing file fails its manifest check: {problem}", file=out)
                if not force:
                    print(f"{file}: cannot compare expectations; --force rewrites it", file=out)
                    refusals += 1
                    continue
            else:
                old = store.read_npz(path)
        changes, adds, same, total = diff_generated(old, new)
        meta_changed = _meta_changes(old, new)
        head = f"{file}: {total} cases: {same} unchanged"
        if adds:
            head += f", {len(adds)} new case(s)/expectation(s)"
        if meta_changed:
            head += f", metadata (size classes, parameters) updated for {meta_changed}"
        if changes:
            head += f", {len(changes)} CHANGED/REMOVED"
        print(head, file=out)
        for c in changes:
            print(f"  CHANGED {c}", file=out)
        for a in adds[:10]:
            print(f"  added {a}", file=out)
        if len(adds) > 10:
            print(f"  ... and {len(adds) - 10} more added", file=out)
        if changes and not force:
            refusals += 1
            continue
        meta = store.meta_from_array(new["__meta__"])
        new_man["files"][file] = {"kind": "generated", "params": meta["params"]}
        if old is not None and not changes and not adds and not meta_changed:
            new_man["files"][file].update(sha256=entry["sha256"], bytes=entry["bytes"])
        else:
            data = store.npz_bytes(new)
            writes[file] = data
            new_man["files"][file].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    if refusals:
        print(
            f"golden regen: refused ({refusals} file(s) would change existing expectations or "
            f"are unusable); nothing written. Rerun with --force to accept the new bits.",
            file=err,
        )
        return 1
    if _refuse_unlisted(expected, new_man, sets, err):
        return 1
    if dry_run:
        print(f"golden regen: dry run, {len(writes)} file(s) would be written", file=out)
        return 0
    written: list[str] = []
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        for file, data in writes.items():
            store.write_atomic(data_dir / file, data)
            written.append(file)
            print(f"{file}: written ({len(data)} bytes)", file=out)
        if new_man != man:
            store.write_manifest(data_dir, new_man)
            print(f"{store.MANIFEST}: written", file=out)
        else:
            print("golden regen: nothing changed", file=out)
    except OSError as e:
        where = e.filename or data_dir
        tail = (
            f"; {', '.join(written)} already written, the manifest not: rerun regen"
            if written
            else "; nothing written"
        )
        print(f"golden regen: cannot write {one_line(where)}: {e.strerror or e}{tail}", file=err)
        return 1
    return 0


def _refuse_unlisted(expected: dict, new_man: dict, sets, out, planned: bool = False) -> bool:
    """True (and say why) when the manifest to write would not list every expected file.

    ``planned``: before building anything, count the selected sets as covered.
    """
    covered = set(new_man["files"])
    if planned:
        covered |= {f for f, s in expected.items() if not sets or s in sets}
    unlisted = sorted(set(expected) - covered)
    if not unlisted:
        return False
    need = sorted({expected[f] for f in unlisted} | set(sets))
    print(
        f"golden regen: refused: the manifest would not list {', '.join(unlisted)} (not "
        f"regenerated in this run and not in the existing manifest); nothing written. "
        f"Rerun without --sets (or with --sets {' '.join(need)}).",
        file=out,
    )
    return True


def add_arguments(p) -> None:
    """``q2gemv golden ...`` subcommands (regen); no subcommand prints the choices."""
    sub = p.add_subparsers(dest="golden_command", metavar="SUBCOMMAND", title="subcommands")
    r = sub.add_parser(
        "regen",
        help="regenerate the golden files from the NumPy references",
        description="Rebuild the generated golden files from the NumPy references and "
        "rewrite the manifest. Refuses (exit 1, nothing written) to change an existing "
        "expectation, to record a changed or unlisted hand-written file, or to work "
        "without a valid manifest, unless --force.",
    )
    r.add_argument(
        "--force",
        action="store_true",
        help="accept changed expectations, changed hand-written files and a missing or "
        "corrupt manifest",
    )
    r.add_argument("--dry-run", action="store_true", help="show what would change; write nothing")
    r.add_argument(
        "--sets",
        nargs="+",
        default=[],
        choices=SETS,
        metavar="SET",
        help=f"only these sets: {', '.join(SETS)} (default: all)",
    )
    r.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="golden data directory (default: the packaged one)",
    )
    r.set_defaults(func=_regen_cmd)
    p.set_defaults(func=lambda args: _no_subcommand(p))


def _no_subcommand(p) -> int:
    p.print_usage(sys.stderr)
    print(
        "q2gemv golden: choose a subcommand: regen (see q2gemv golden regen --help)",
        file=sys.stderr,
    )
    return 2


def _regen_cmd(args) -> int:
    return regen(args.data_dir, force=args.force, sets=tuple(args.sets), dry_run=args.dry_run)

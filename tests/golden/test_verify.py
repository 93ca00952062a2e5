"""Golden data integrity as ``q2gemv verify`` checks it: the manifest checked against the
suite's expected files both ways, zero checks is not a pass, malformed manifests as one-line
errors. Everything runs in process on the tables set (no simulator).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from q2gemv import cli
from q2gemv.golden import gen, regen, store, suite
from tests.golden.test_harness import copy_data

DATA = store.default_data_dir()


@pytest.fixture
def data_copy(tmp_path) -> Path:
    return copy_data(tmp_path)


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    got = capsys.readouterr()
    return rc, got.out, got.err


def _verify_tables(capsys, data_dir, *extra) -> tuple[int, str, str]:
    return _cli(
        capsys, "verify", "--data-dir", str(data_dir), "--backend", "reference",
        "--cases", "tables", "--quiet", *extra,
    )  # fmt: skip


def _edit_manifest(data_dir: Path, edit) -> None:
    p = data_dir / store.MANIFEST
    man = json.loads(p.read_text())
    edit(man)
    p.write_text(json.dumps(man))


# -- the expected set comes from the generator --------------------------------------------------


def test_expected_files_follow_the_generators_families(monkeypatch):
    fams = dict(gen.FAMILY_KERNELS)
    assert {f"gemv_{f}.npz" for f in fams} <= set(suite.expected_files())
    assert set(suite.expected_files()) == set(store.read_manifest(DATA)["files"])
    # a family added to the generator is a file every check expects, with no other edit
    monkeypatch.setattr(gen, "FAMILY_KERNELS", fams | {"newfam": ("newfam_gemv",)})
    assert suite.expected_files()["gemv_newfam.npz"] == "newfam"
    assert "newfam" in suite.sets()
    assert "gemv_newfam.npz" in regen.generated_files()
    bad = suite.integrity_problems(DATA, store.read_manifest(DATA))
    assert list(bad) == ["gemv_newfam.npz"] and "not listed" in bad["gemv_newfam.npz"]


# -- both directions ------------------------------------------------------------------------------


@pytest.mark.parametrize("delete_file", [False, True])
def test_a_removed_manifest_entry_is_an_integrity_failure(data_copy, capsys, delete_file):
    _edit_manifest(data_copy, lambda m: m["files"].pop("gemv_q2_0.npz"))
    if delete_file:
        (data_copy / "gemv_q2_0.npz").unlink()
    rc, out, err = _verify_tables(capsys, data_copy)
    assert rc == 2, out + err
    assert "gemv_q2_0.npz is not listed" in out and "FAIL" in out.splitlines()[-1]
    n = len(suite.expected_files())
    assert f"{n} files expected, {n - 1} intact" in out
    rc, out, _ = _cli(capsys, "verify", "--data-dir", str(data_copy), "--list")
    assert rc == 2 and " q2_0/g64/" not in out  # the unlisted file's cases are not listed


def test_an_extra_file_or_entry_is_an_integrity_failure(data_copy, capsys):
    (data_copy / "gemv_extra.npz").write_bytes((data_copy / "gemv_q2_0.npz").read_bytes())
    rc, out, _ = _verify_tables(capsys, data_copy)
    assert rc == 2 and "unexpected file gemv_extra.npz" in out
    entry = json.loads((data_copy / store.MANIFEST).read_text())["files"]["gemv_q2_0.npz"]
    _edit_manifest(data_copy, lambda m: m["files"].__setitem__("gemv_extra.npz", entry))
    rc, out, _ = _verify_tables(capsys, data_copy)
    assert rc == 2 and "lists gemv_extra.npz, which is not a golden file" in out


def test_a_changed_hash_and_a_missing_file_are_integrity_failures(data_copy, capsys):
    _edit_manifest(data_copy, lambda m: m["files"]["table_bf16.json"].update(sha256="0" * 64))
    (data_copy / "roundtrip.npz").unlink()
    with pytest.raises(store.GoldenIntegrityError) as e:
        suite.load_suite(data_copy, strict=True)
    assert len(e.value.problems) == 2
    rc, out, _ = _verify_tables(capsys, data_copy)
    assert rc == 2 and "table_bf16.json was modified" in out and "roundtrip.npz is missing" in out


# -- zero checks ----------------------------------------------------------------------------------


def test_a_selection_that_checks_nothing_is_not_a_pass(capsys):
    rc, out, _ = _cli(capsys, "verify", "--backend", "cuda", "--cases", "tables", "--quiet")
    assert rc == 1, out
    assert "PASS" not in out and "nothing was checked" in out.splitlines()[-1]
    rc, out, _ = _cli(
        capsys, "verify", "--backend", "cuda", "--cases", "tables", "--quiet", "--json"
    )
    assert rc == 1 and json.loads(out)["ok"] is False


# -- malformed manifests: one line, exit 2 ------------------------------------------------------


def _null(m):
    m["files"]["gemv_q2_0.npz"] = None


def _list(m):
    m["files"]["gemv_q2_0.npz"] = [1, 2]


def _bytes_x(m):
    m["files"]["gemv_q2_0.npz"]["bytes"] = "x"


def _generator_list(m):
    m["generator"] = [1]


@pytest.mark.parametrize("edit", [_null, _list, _bytes_x, _generator_list])
def test_malformed_manifest_entries_are_one_line_errors(data_copy, capsys, edit):
    _edit_manifest(data_copy, edit)
    rc, out, err = _verify_tables(capsys, data_copy)
    assert rc == 2 and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("q2gemv verify: golden manifest") and "FAIL" in out


@pytest.mark.parametrize("case", ["non-utf8", "directory", "data-dir-is-a-file", "top-list"])
def test_unreadable_manifests_are_one_line_errors(data_copy, capsys, case):
    man = data_copy / store.MANIFEST
    target = data_copy
    if case == "non-utf8":
        man.write_bytes(b'\xff\xfe{"files": {}}')
    elif case == "directory":
        man.unlink()
        man.mkdir()
    elif case == "data-dir-is-a-file":
        target = data_copy / "roundtrip.npz"
    else:
        man.write_text("[1]")
    rc, out, err = _verify_tables(capsys, target)
    assert rc == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "FAIL: golden data unusable" in out


# -- regen never works blind and never drops a file -------------------------------------------

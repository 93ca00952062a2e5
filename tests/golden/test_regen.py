"""``q2gemv golden regen``: deterministic, refuses to change expectations without --force."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from q2gemv.golden import regen, store, suite
from q2gemv.reference import q2_0 as ref_q2
from tests.golden.test_harness import copy_data
from tests.golden.test_verify import _cli, _edit_manifest


@pytest.fixture
def data_copy(tmp_path) -> Path:
    return copy_data(tmp_path)


def _regen(data_dir, **kw) -> tuple[int, str]:
    out = io.StringIO()
    rc = regen.regen(data_dir, out=out, **kw)
    return rc, out.getvalue()


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_regen_of_intact_data_changes_nothing_byte_for_byte(data_copy):
    before = _snapshot(data_copy)
    rc, text = _regen(data_copy, sets=("q2_0", "w4a16", "roundtrip", "tables", "ggml"))
    assert rc == 0, text
    assert "golden regen: nothing changed" in text
    assert "gemv_q2_0.npz: " in text and "CHANGED" not in text
    assert _snapshot(data_copy) == before


def _flip_lsb_of_first_output(monkeypatch):
    real = ref_q2.q2_0_gemv

    def changed(a, w):
        y = real(a, w)
        if y.ndim == 2 and y.size:
            y = y.copy()
            y.view(np.uint16)[0, 0] ^= 1
        return y

    monkeypatch.setattr(ref_q2, "q2_0_gemv", changed)


def test_regen_refuses_a_changed_expectation_and_prints_the_diff(data_copy, monkeypatch):
    before = _snapshot(data_copy)
    _flip_lsb_of_first_output(monkeypatch)
    rc, text = _regen(data_copy, sets=("q2_0",))
    assert rc == 1
    assert "refused" in text and "--force" in text
    line = next(ln for ln in text.splitlines() if "CHANGED q2_0/g64/n1_k64_m1" in ln)
    assert "q2_0_gemv:" in line and "1 of 1 elements differ" in line
    assert "(row 0, col 0) old 0x" in line and " new 0x" in line
    assert _snapshot(data_copy) == before  # nothing written


def test_regen_force_rewrites_and_the_manifest_follows(data_copy, monkeypatch):
    _flip_lsb_of_first_output(monkeypatch)
    rc, text = _regen(data_copy, sets=("q2_0",), force=True)
    assert rc == 0, text
    assert "gemv_q2_0.npz: written" in text and "manifest.json: written" in text
    s = suite.load_suite(data_copy, strict=True)  # the new file matches its manifest entry
    case = next(c for c in s.gemv if c.id == "q2_0/g64/n1_k64_m1/uniform/normal")
    from q2gemv.formats.bf16 import bits_to_bf16

    want = ref_q2.q2_0_gemv(bits_to_bf16(case.a_bits()), case.weight()).view(np.uint16)
    assert np.array_equal(case.want("q2_0_gemv"), want)
    rc, text = _regen(data_copy, sets=("q2_0",))
    assert rc == 0 and "nothing changed" in text


def test_regen_dry_run_writes_nothing(data_copy, monkeypatch):
    before = _snapshot(data_copy)
    _flip_lsb_of_first_output(monkeypatch)
    rc, text = _regen(data_copy, sets=("q2_0",), force=True, dry_run=True)
    assert rc == 0 and "dry run" in text
    assert _snapshot(data_copy) == before


def test_regen_refuses_an_edited_hand_table(data_copy):
    p = data_copy / "table_e2m1.json"
    p.write_text(p.read_text().replace('"0x1": "0.5"', '"0x1": "0.75"'))
    rc, text = _regen(data_copy, sets=("tables",))
    assert rc == 1 and "table_e2m1.json: CHANGED" in text and "hand-written" in text
    rc, text = _regen(data_copy, sets=("tables",), force=True)
    assert rc == 0  # accepted on purpose; verify then reports the wrong value as a mismatch


def test_regen_refuses_to_overwrite_a_tampered_file(data_copy):
    p = data_copy / suite.ROUNDTRIP_FILE
    p.write_bytes(p.read_bytes()[:-10])
    rc, text = _regen(data_copy, sets=("roundtrip",))
    assert rc == 1 and "fails its manifest check" in text and "truncated" in text
    rc, text = _regen(data_copy, sets=("roundtrip",), force=True)
    assert rc == 0 and suite.load_suite(data_copy).problems == []


def test_regen_command_line(data_copy):
    proc = subprocess.run(
        [sys.executable, "-m", "q2gemv.cli", "golden", "regen", "--data-dir", str(data_copy),
         "--sets", "roundtrip"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "roundtrip.npz: 6 cases: 6 unchanged" in proc.stdout


@pytest.mark.parametrize("manifest", [None, "{", '{"files": {"roundtrip.npz": null}}'])
def test_regen_refuses_without_a_valid_manifest(data_copy, manifest):
    man = data_copy / store.MANIFEST
    if manifest is None:
        man.unlink()
    else:
        man.write_text(manifest)
    before = _snapshot(data_copy)
    rc, text = _regen(data_copy, sets=("tables",))
    assert rc == 1 and "refused" in text and "--force" in text
    # --force with a subset cannot list the other sets: refused before building anything
    rc, text = _regen(data_copy, sets=("tables",), force=True)
    assert rc == 1 and "would not list" in text and "gemv_q2_0.npz" in text
    assert _snapshot(data_copy) == before


def test_regen_refuses_to_record_an_unlisted_hand_written_file(data_copy):
    _edit_manifest(data_copy, lambda m: m["files"].pop("table_e2m1.json"))
    before = _snapshot(data_copy)
    rc, text = _regen(data_copy, sets=("tables",))
    assert rc == 1 and "table_e2m1.json: not in the manifest" in text
    assert _snapshot(data_copy) == before
    rc, text = _regen(data_copy, sets=("tables",), force=True)
    assert rc == 0 and suite.load_suite(data_copy).problems == []


def test_regen_into_an_unwritable_directory_is_one_line(data_copy, capsys, monkeypatch):
    p = data_copy / "table_e2m1.json"
    p.write_text(p.read_text().replace('"0x1": "0.5"', '"0x1": "0.75"'))

    def denied(path, data):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(store, "write_atomic", denied)
    rc, out, err = _cli(
        capsys, "golden", "regen", "--data-dir", str(data_copy), "--sets", "tables", "--force"
    )
    assert rc == 1 and "Traceback" not in out + err
    assert err.strip().splitlines()[-1].startswith("golden regen: cannot write")  # issue 24
    assert "Permission denied" in err


def test_golden_without_a_subcommand_names_the_choices(capsys):
    rc, _, err = _cli(capsys, "golden")
    assert rc == 2 and "choose a subcommand: regen" in err

"""Hardening round 3, items 9-14 (issue 24): CLI streams, bounded seed references, no-backend
uploads, bf16 quantization, newcomer papercuts, borderline inputs.

Host-side checks only; nothing here launches a kernel (subprocesses run with the simulator off).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from q2gemv.formats.q2_0 import quantize_q2_0
from q2gemv.host.backends import gpu_present

SRC = Path(__file__).resolve().parents[1] / "src"


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(SRC), **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True
    )


# -- 11. no GPU and no simulator -------------------------------------------------------------


@pytest.mark.skipif(gpu_present(), reason="needs a machine without a CUDA GPU")
def test_to_device_without_any_backend_raises_the_one_line_backend_error():
    r = _run(
        """
        import numpy as np
        import q2gemv
        from q2gemv.formats.nvfp4 import Nvfp4Weight
        w = q2gemv.quantize_q2_0(np.ones((2, 128), np.float32))
        f = Nvfp4Weight.from_float(np.ones((2, 16), np.float32))
        msgs = []
        import ml_dtypes
        try:
            q2gemv.gemv(np.zeros(128, ml_dtypes.bfloat16), w, backend="cuda")
        except ValueError as e:
            msgs.append(str(e))
        for call in (w.to_device, f.to_device, lambda: q2gemv.to_device(w)):
            try:
                call()
            except ValueError as e:
                msgs.append(str(e))
        print(len(msgs))
        for m in msgs:
            print(m)
        """,
        NUMBA_ENABLE_CUDASIM="0",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0] == "4", r.stdout
    assert len(lines) == 5, r.stdout  # each message is one line
    assert lines[1].startswith("backend: 'cuda' needs a CUDA GPU or the CUDA simulator")
    assert len(set(lines[1:])) == 1, lines


# -- 12. quantize_q2_0 takes bf16 ------------------------------------------------------------


@pytest.mark.parametrize("method", ["ggml", "absmean"])
def test_quantize_q2_0_takes_bf16_as_its_fp32_value(method):
    rng = np.random.default_rng(12)
    w = rng.standard_normal((3, 128)).astype(ml_dtypes.bfloat16)
    got = quantize_q2_0(w, 64, method)
    want = quantize_q2_0(w.astype(np.float32), 64, method)
    assert got.raw.tobytes() == want.raw.tobytes()


def test_quantize_q2_0_still_refuses_integers():
    with pytest.raises(TypeError, match="^w: expected a float array, got int32"):
        quantize_q2_0(np.zeros((1, 128), np.int32))


# -- 13. newcomer papercuts ------------------------------------------------------------------


def test_version_flag_prints_the_package_version(capsys):
    import q2gemv
    from q2gemv.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"q2gemv {q2gemv.__version__}\n"


def test_ptx_without_nvvm_is_one_line_with_an_install_hint():
    r = _run(
        """
        import sys
        from numba.cuda.cudadrv.error import NvvmSupportError
        import q2gemv.cuda.ptx as ptx
        def no_nvvm(*args, **kwargs):
            raise NvvmSupportError("libNVVM cannot be found.\\nDo `conda install cudatoolkit`:\\n")
        ptx.compile_all = no_nvvm
        sys.exit(ptx.main(["--family", "q2_0"]))
        """,
        NUMBA_ENABLE_CUDASIM="0",
    )
    assert r.returncode == 1, r.stderr
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("q2gemv.cuda.ptx: libNVVM cannot be found.;")
    assert "pip install 'q2gemv[cu13]'" in lines[0]


def test_ptx_under_the_simulator_is_one_line(capsys):
    from q2gemv.cuda import ptx

    assert ptx.main(["--family", "q2_0"]) == 1  # conftest switched the simulator on
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NUMBA_ENABLE_CUDASIM unset" in err


def test_bench_help_states_the_prefix_rule_device_prefix_follows():
    import argparse

    from q2gemv.bench.command import add_arguments
    from q2gemv.bench.results import SIM_PREFIX, device_prefix

    p = argparse.ArgumentParser()
    add_arguments(p)
    (prefix,) = [a for a in p._actions if a.dest == "prefix"]
    assert "'_dryrun' appended for --dry-run on a GPU" in prefix.help
    assert device_prefix({"simulated": True, "dry_run": True}) == SIM_PREFIX
    assert device_prefix({"device": "NVIDIA H200", "dry_run": True}) == "h200_dryrun"


# -- 10. the seed references' memory does not grow with M ------------------------------------


@pytest.mark.parametrize("family", ["q2_0_gemv", "q2_0_gemv_vec", "w4a16_gemv"])
def test_seed_reference_memory_is_bounded_by_its_chunk_not_by_m(monkeypatch, family):
    """Chunks shrunk to 2**16 elements: the peak beyond the bf16 output stays a few MB at
    M=20000, N=64 (before: an fp32 [M, N] result and its rounding temporaries, ~36 bytes per
    output element, 46 MB here); the bits equal the default chunking's."""
    import tracemalloc

    from q2gemv import reference
    from q2gemv.formats.bf16 import bits_to_bf16
    from q2gemv.formats.nvfp4 import Nvfp4Weight
    from q2gemv.reference import nvfp4 as ref_w4
    from q2gemv.reference import q2_0 as ref_q2

    rng = np.random.default_rng(10)
    m, n = 20000, 64
    if family.startswith("q2"):
        w = quantize_q2_0(rng.standard_normal((n, 64)).astype(np.float32), 64)
    else:
        w = Nvfp4Weight.from_float(rng.standard_normal((n, 16)).astype(np.float32))
    a = bits_to_bf16((rng.integers(0, 1 << 14, (m, w.k)) | 0x3C00).astype(np.uint16))
    fn = getattr(reference, family)
    want = fn(a[:3000], w).view(np.uint16)  # default chunks
    monkeypatch.setattr(ref_q2, "_CHUNK_ELEMS", 1 << 16)
    monkeypatch.setattr(ref_w4, "_CHUNK_ELEMS", 1 << 16)
    tracemalloc.start()
    try:
        y = fn(a, w)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert y.shape == (m, n)
    assert peak - y.nbytes < 8_000_000, peak
    np.testing.assert_array_equal(y[:3000].view(np.uint16), want)


# -- 14. borderline inputs -------------------------------------------------------------------


def _gguf_with_alignment(path: Path, layout: int, claimed: int, n_tensors: int = 2) -> None:
    """A GGUF written by the ``gguf`` package padded to ``layout``, whose ``general.alignment``
    then says ``claimed`` (the u32 patched in place)."""
    import gguf

    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_custom_alignment(layout)
    for i in range(n_tensors):
        wr.add_tensor(f"t{i}", np.arange(1, 9 + 8 * i, dtype=np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    data = bytearray(path.read_bytes())
    at = data.index(b"general.alignment") + len(b"general.alignment") + 4  # key, u32 type
    assert int.from_bytes(data[at : at + 4], "little") == layout
    data[at : at + 4] = claimed.to_bytes(4, "little")
    path.write_bytes(bytes(data))


def test_gguf_read_with_its_own_alignment(tmp_path):
    from q2gemv.io.gguf.reader import read_gguf

    p = tmp_path / "ok.gguf"
    _gguf_with_alignment(p, 64, 64)
    f = read_gguf(p)
    assert f.alignment == 64 and f.data_offset % 64 == 0
    t1 = f.tensor("t1")
    got = np.frombuffer(p.read_bytes()[t1.offset : t1.offset + t1.nbytes], np.float32)
    np.testing.assert_array_equal(got, np.arange(1, 17, dtype=np.float32))


@pytest.mark.parametrize(("layout", "claimed"), [(64, 32), (64, 128), (32, 64)])
def test_gguf_whose_alignment_disagrees_with_its_layout_is_refused(tmp_path, layout, claimed):
    from q2gemv.io.gguf.reader import GgufError, read_gguf

    for n_tensors in (1, 2, 3):  # header ends at different offsets: some agree by chance
        p = tmp_path / f"bad{n_tensors}.gguf"
        _gguf_with_alignment(p, layout, claimed, n_tensors)
        data = p.read_bytes()
        try:
            f = read_gguf(p)
        except GgufError as e:
            assert "alignment" in str(e) or "past the end" in str(e), e
            continue
        # accepted: then every tensor must be where the layout put it (same bytes as written)
        for i in range(n_tensors):
            t = f.tensor(f"t{i}")
            got = np.frombuffer(data[t.offset : t.offset + t.nbytes], np.float32)
            want = np.arange(1, 9 + 8 * i, dtype=np.float32)
            np.testing.assert_array_equal(got, want, err_msg=f"{p.name}: read off")


@pytest.mark.parametrize(
    "g_ct", [1e-40, -1e-40, np.float32(2.0**-129), np.array([1e-39], np.float32)]
)
def test_compressed_tensors_divisor_with_an_infinite_reciprocal_is_refused(g_ct):
    from q2gemv.formats.nvfp4 import Nvfp4Weight, global_scale_from_divisor

    with pytest.raises(ValueError, match=r"^weight_global_scale: expected a divisor whose fp32"):
        global_scale_from_divisor(g_ct)
    packed, scales = np.zeros((1, 8), np.uint8), np.full((1, 1), 0x38, np.uint8)
    with pytest.raises(ValueError, match=r"^weight_global_scale: expected a divisor"):
        Nvfp4Weight.from_compressed_tensors(packed, scales, g_ct)


def test_smallest_divisor_with_a_finite_reciprocal_is_kept():
    from q2gemv.formats.nvfp4 import global_scale_from_divisor

    assert global_scale_from_divisor(2.0**-127) == 2.0**127
    assert global_scale_from_divisor(0.0) == np.inf  # a special given as such: validate() reports


def test_safetensors_load_refuses_a_divisor_with_an_infinite_reciprocal(tmp_path):
    from safetensors.numpy import save_file

    from q2gemv.io.safetensors.reader import load_nvfp4_weights

    p = tmp_path / "ct.safetensors"
    save_file(
        {
            "l.weight_packed": np.zeros((2, 8), np.uint8),
            "l.weight_scale": np.full((2, 1), 0x38, np.uint8),
            "l.weight_global_scale": np.array([1e-40], np.float32),
        },
        str(p),
    )
    with pytest.raises(ValueError, match=r"weight_global_scale: expected a divisor"):
        load_nvfp4_weights(p)


@pytest.mark.parametrize("cls_name", ["Q2Linear", "Nvfp4Linear"])
def test_from_linear_on_a_meta_linear_names_the_argument(cls_name):
    torch = pytest.importorskip("torch")
    import q2gemv.torch as qt

    with torch.device("meta"):
        lin = torch.nn.Linear(128, 16)
    with pytest.raises(ValueError, match=r"^linear: its weight is on the meta device"):
        getattr(qt, cls_name).from_linear(lin)


@pytest.mark.parametrize("cls_name", ["Q2Linear", "Nvfp4Linear"])
def test_fx_symbolic_trace_and_jit_script_refuse_rather_than_trace_wrongly(cls_name):
    """Decided (docs/guarantees.md): torch.export / jit.trace / torch.compile are the supported
    captures; fx.symbolic_trace and jit.script raise (never a graph that computes other bits)."""
    torch = pytest.importorskip("torch")
    import q2gemv.torch as qt

    m = getattr(qt, cls_name).from_linear(torch.nn.Linear(128, 16))
    with pytest.raises(TypeError, match=r"^x: expected a torch.Tensor, got Proxy"):
        torch.fx.symbolic_trace(m)
    with pytest.raises(Exception, match="annotation|script|compile"):  # noqa: B017, PT011
        torch.jit.script(m)


# -- 9. CLI: one escaped line per error, JSON stays JSON, outputs checked first --------------


def _cli(argv, capsys):
    from q2gemv.cli import main

    try:
        rc = main(argv)
    except SystemExit as e:  # argparse usage errors
        rc = e.code
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_bench_negative_seed_is_a_usage_error(capsys):
    rc, out, err = _cli(["bench", "--seed", "-1", "--dry-run"], capsys)
    assert rc == 2 and out == ""
    assert "--seed: expected an integer >= 0, got -1" in err and "Traceback" not in err


def _no_run(monkeypatch):
    from q2gemv.bench import runner

    def must_not_run(*args, **kwargs):
        raise AssertionError("cases ran before the outputs were checked")

    monkeypatch.setattr(runner, "execute", must_not_run)


@pytest.mark.parametrize("prefix", ["../x", "a/b", "..", "x\ny"])
def test_bench_prefix_must_be_a_file_name(tmp_path, monkeypatch, capsys, prefix):
    _no_run(monkeypatch)
    argv = ["bench", "--dry-run", "--out", str(tmp_path / "o"), "--prefix", prefix]
    rc, out, err = _cli(argv + ["--shapes", "128x128", "--m", "1", "--no-torch"], capsys)
    assert rc == 2 and out == ""
    assert (
        err.startswith("q2gemv bench: --prefix: expected a file name prefix")
        and err.count("\n") == 1
    ), err
    assert not (tmp_path / "x").exists()


def test_bench_unusable_out_is_refused_before_any_case_runs(tmp_path, monkeypatch, capsys):
    _no_run(monkeypatch)
    blocker = tmp_path / "file\x1bname"
    blocker.write_text("not a folder")
    argv = ["bench", "--dry-run", "--out", str(blocker / "sub")]
    rc, out, err = _cli(argv + ["--shapes", "128x128", "--m", "1", "--no-torch"], capsys)
    assert rc == 2 and out == ""
    assert err.startswith("q2gemv bench: --out: cannot create the folder") and "\x1b" not in err
    assert err.count("\n") == 1, err


def test_verify_list_and_selection_errors_honour_json(capsys):
    import json

    rc, out, err = _cli(["verify", "--list", "--json", "--kernel", "q2_0_gemv_vec"], capsys)
    listed = json.loads(out)
    assert rc == 0 and listed["ok"] and listed["checks"]
    assert {c["kernel"] for c in listed["checks"]} <= {"q2_0_gemv_vec", "host"}
    assert any(c["kernel"] == "q2_0_gemv_vec" for c in listed["checks"])
    rc, out, err = _cli(["verify", "--json", "--kernel", "no_such_kernel"], capsys)
    assert rc == 1 and json.loads(out)["ok"] is False
    assert err.startswith("q2gemv verify: ") and err.count("\n") == 1


def test_inspect_escapes_a_path_with_a_newline(tmp_path, capsys):
    p = tmp_path / "a\nb\x1b[31m.gguf"
    p.write_bytes(b"not a gguf file at all")
    rc, out, err = _cli(["inspect", str(p)], capsys)
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and "\x1b" not in err and "a\\nb\\x1b[31m.gguf" in err


@pytest.mark.parametrize("argv", [["verify", "--list"], ["golden", "regen", "--dry-run"]])
def test_stdout_on_a_full_disk_is_one_line_and_status_1(argv):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, "-m", "q2gemv.cli", *argv],
            env={**os.environ, "PYTHONPATH": str(SRC), "NUMBA_ENABLE_CUDASIM": "1"},
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert r.returncode == 1, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and "No space left on device" in r.stderr, r.stderr


def test_golden_regen_refusal_goes_to_stderr(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "q2gemv.cli", "golden", "regen", "--data-dir", str(tmp_path)],
        env={**os.environ, "PYTHONPATH": str(SRC), "NUMBA_ENABLE_CUDASIM": "1"},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("golden regen: refused:"), r.stderr


def test_golden_regen_refusal_escapes_the_path(tmp_path, capsys):
    d = tmp_path / "gold\nen\x1b"
    d.mkdir()
    rc, out, err = _cli(["golden", "regen", "--data-dir", str(d)], capsys)
    assert rc == 1 and out == ""
    assert err.startswith("golden regen: refused:") and err.count("\n") == 1, err
    assert "\x1b" not in err

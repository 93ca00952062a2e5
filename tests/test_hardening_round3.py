"""Hardening round 3 (issue 24): atomic writes, one global-scale validator, fixed-width
integer sizes, any buffer, immutable copies and prepared operands, bounded tier planning.

Host-side checks only; nothing here launches a kernel (the device weight is built around
host stand-ins of device arrays where a constructor needs one).
"""

from __future__ import annotations

import array
import ast
import builtins
import copy
import errno
import json
import mmap
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from q2gemv.formats.q2_0 import quantize_q2_0
from q2gemv.io.gguf.reader import load_q2_weights
from q2gemv.io.gguf.writer import save_q2_weights
from q2gemv.tools import atomic as _atomic

SRC = Path(__file__).resolve().parents[1] / "src"


def _q2(n: int = 2, k: int = 128, group: int = 64, seed: int = 0):
    rng = np.random.default_rng(seed)
    return quantize_q2_0(rng.standard_normal((n, k)).astype(np.float32), group=group)


# -- 1. atomic writes ------------------------------------------------------------------------


def test_saving_over_the_mapped_source_keeps_the_process_and_the_file(tmp_path):
    """load_q2_weights maps the file; saving over it used to truncate it in place (SIGBUS).

    Run in a child process: before the fix the child died of SIGBUS (it would kill pytest).
    """
    p = tmp_path / "w.gguf"
    save_q2_weights(p, {"a": _q2(4, 256, 64, 1), "b": _q2(3, 128, 128, 2)})
    code = textwrap.dedent(
        f"""
        import numpy as np
        from q2gemv.io.gguf import load_q2_weights, save_q2_weights
        p = {str(p)!r}
        ws = load_q2_weights(p)
        before = {{k: w.raw.tobytes() for k, w in ws.items()}}
        save_q2_weights(p, ws)                      # over the file ws is mapped from
        assert {{k: w.raw.tobytes() for k, w in ws.items()}} == before  # old map intact
        ws[\"b\"] = ws.pop(\"a\")                     # save again, different content
        save_q2_weights(p, ws)
        print(\"ok\")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() == "ok"
    back = load_q2_weights(p)
    assert list(back) == ["b"]
    assert back["b"].raw.tobytes() == _q2(4, 256, 64, 1).raw.tobytes()
    assert sorted(os.listdir(tmp_path)) == ["w.gguf"]


class _FailingFile:
    """Wraps a real file; its write raises ``exc`` once ``after`` bytes have been written."""

    def __init__(self, f, after: int, exc: BaseException) -> None:
        self._f, self._left, self._exc = f, after, exc

    def write(self, data) -> int:
        data = memoryview(data).cast("B") if not isinstance(data, str) else data
        if len(data) > self._left:
            self._f.write(data[: self._left])
            self._left = 0
            raise self._exc
        self._left -= len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)


@pytest.mark.parametrize(
    "exc",
    [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt(), RuntimeError("x")],
    ids=["disk-full", "interrupt", "exception"],
)
def test_a_failed_save_leaves_the_original_and_no_temporary(tmp_path, monkeypatch, exc):
    p = tmp_path / "w.gguf"
    save_q2_weights(p, {"a": _q2()})
    original = p.read_bytes()
    real_fdopen, real_open = os.fdopen, builtins.open

    def failing(real):
        def opener(file, mode="r", *a, **kw):
            f = real(file, mode, *a, **kw)
            return _FailingFile(f, 100, exc) if set(mode) & set("wax+") else f

        return opener

    # Every way a writer could open its file fails after 100 bytes.
    monkeypatch.setattr(os, "fdopen", failing(real_fdopen))
    monkeypatch.setattr(builtins, "open", failing(real_open))
    bigger = {"a": _q2(8, 256, 64, 3), "b": _q2(8, 256, 128, 4)}
    with pytest.raises(type(exc)):
        save_q2_weights(p, bigger)
    monkeypatch.undo()
    assert p.read_bytes() == original
    assert sorted(os.listdir(tmp_path)) == ["w.gguf"]


def test_a_failed_fsync_leaves_the_original(tmp_path, monkeypatch):
    """A full disk can surface at fsync (delayed allocation): still nothing replaced."""
    p = tmp_path / "w.gguf"
    save_q2_weights(p, {"a": _q2()})
    original = p.read_bytes()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        save_q2_weights(p, {"b": _q2(4, 128, 64, 5)})
    monkeypatch.undo()
    assert p.read_bytes() == original
    assert sorted(os.listdir(tmp_path)) == ["w.gguf"]


def test_atomic_write_keeps_mode_and_follows_symlinks(tmp_path):
    real = tmp_path / "real.bin"
    real.write_bytes(b"old")
    os.chmod(real, 0o640)
    link = tmp_path / "link.bin"
    link.symlink_to(real)
    _atomic.write_bytes(link, b"new")
    assert link.is_symlink() and real.read_bytes() == b"new"
    assert (os.stat(real).st_mode & 0o777) == 0o640
    assert sorted(os.listdir(tmp_path)) == ["link.bin", "real.bin"]


def _writers(tree: ast.AST) -> list[int]:
    """Lines of ``tree`` that write a file themselves: open() for writing, pathlib's
    write_bytes/write_text, ndarray.tofile, np.save/savez, safetensors' save_file."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and getattr(f.value, "id", "") == "_atomic":
            continue  # the helper itself
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name in ("write_bytes", "write_text", "tofile", "save", "savez", "save_file"):
            lines.append(node.lineno)
        elif name == "open":
            modes = [a for a in node.args[1:2]] + [
                k.value for k in node.keywords if k.arg == "mode"
            ]
            if any(isinstance(m, ast.Constant) and set(str(m.value)) & set("wax+") for m in modes):
                lines.append(node.lineno)
    return lines


def test_the_writer_scan_finds_writers():
    tree = ast.parse(
        "open(p, 'wb')\nopen(p, mode='a')\nq.write_text(s)\nnp.save(p, a)\nopen(p)\n_atomic.write_text(p, s)"
    )
    assert _writers(tree) == [1, 2, 3, 4]


def test_every_package_writer_goes_through_the_atomic_helper():
    """No module of the package writes a file itself: q2gemv.tools.atomic is the one place."""
    pkg = SRC / "q2gemv"
    bad = []
    for path in sorted(pkg.rglob("*.py")):
        if path != pkg / "tools" / "atomic.py":
            text = path.read_text()
            bad += [f"{path.relative_to(pkg)}:{i}" for i in _writers(ast.parse(text))]
    assert bad == []


# -- 4. one global-scale validator ------------------------------------------------------------

BAD_SCALES = [
    1e39,
    -1e39,
    1e-46,
    2**200,
    2**2000,
    np.float64(1e39),
    1 + 0j,
    np.complex64(2),
    np.array([1 + 0j]),
    np.array([1.0, 2.0], np.float32),
    True,
    "1.0",
]
BAD_IDS = [
    "1e39", "-1e39", "1e-46", "2**200", "2**2000", "f64-1e39", "complex", "np-complex",
    "complex-array", "size-2", "bool", "str",
]  # fmt: skip


def _nvfp4_parts():
    from q2gemv.formats.nvfp4 import Nvfp4Weight

    w = Nvfp4Weight.from_float(np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32))
    return np.array(w.packed), np.array(w.scales)


def _host_error(g) -> tuple[type, str]:
    from q2gemv.formats.nvfp4 import Nvfp4Weight

    packed, scales = _nvfp4_parts()
    with pytest.raises((TypeError, ValueError)) as e:
        Nvfp4Weight(packed, scales, g)
    return e.type, str(e.value)


@pytest.mark.parametrize("g", BAD_SCALES, ids=BAD_IDS)
def test_device_weight_refuses_what_the_host_weight_refuses(g):
    """DeviceNvfp4Weight.from_buffers used to take 1e39 (-> inf), 1e-46 (-> 0), a NumPy
    complex, and to raise OverflowError for 2**2000."""
    from numba import cuda

    from q2gemv.cuda.nvfp4 import DeviceNvfp4Weight

    packed, scales = _nvfp4_parts()
    want_type, want_msg = _host_error(g)
    d_p, d_s = cuda.to_device(packed), cuda.to_device(scales)
    with pytest.raises(want_type) as e:
        DeviceNvfp4Weight.from_buffers(d_p, d_s, g)
    assert str(e.value) == want_msg


@pytest.mark.parametrize(
    "g", [np.array([0.375]), np.float64(0.1), 3, float("inf"), float("nan"), 2.0**-149]
)
def test_device_weight_accepts_what_the_host_weight_accepts(g):
    """A size-1 array used to be refused by from_buffers though Nvfp4Weight takes it."""
    from numba import cuda

    from q2gemv.cuda.nvfp4 import DeviceNvfp4Weight
    from q2gemv.formats.nvfp4 import Nvfp4Weight

    packed, scales = _nvfp4_parts()
    host = Nvfp4Weight(packed, scales, g)
    dw = DeviceNvfp4Weight.from_buffers(cuda.to_device(packed), cuda.to_device(scales), g)
    assert isinstance(dw.global_scale, np.float32)
    assert np.float32(dw.global_scale).view(np.uint32) == np.float32(host.global_scale).view(
        np.uint32
    )


TORCH_BAD = [1e39, -1e39, 1e-46, 2.0**200]  # the op's schema takes a float


@pytest.mark.parametrize("g", TORCH_BAD, ids=str)
def test_torch_op_refuses_what_the_host_weight_refuses(g):
    """torch.ops.q2gemv.nvfp4_linear(..., 1e39) used to return inf/NaN outputs."""
    torch = pytest.importorskip("torch")
    import q2gemv.torch  # noqa: F401  (registers the op)

    packed, scales = _nvfp4_parts()
    x = torch.ones((1, 32), dtype=torch.bfloat16)
    want_type, want_msg = _host_error(g)
    with pytest.raises(want_type) as e:
        torch.ops.q2gemv.nvfp4_linear(x, torch.from_numpy(packed), torch.from_numpy(scales), g)
    assert str(e.value) == want_msg


@pytest.mark.parametrize("form", ["tensor", "legacy dict"])
@pytest.mark.parametrize("g", TORCH_BAD, ids=str)
def test_nvfp4linear_load_state_dict_refuses_what_the_host_weight_refuses(g, form):
    """load_state_dict with global_scale=1e39 used to give a layer with inf/NaN outputs.

    Both forms of the extra state: the JSON tensor layers write, the dict of older checkpoints.
    """
    torch = pytest.importorskip("torch")
    from q2gemv.formats.nvfp4 import Nvfp4Weight
    from q2gemv.torch import Nvfp4Linear

    packed, scales = _nvfp4_parts()
    layer = Nvfp4Linear(Nvfp4Weight(packed, scales, 0.5))
    state = layer.state_dict()
    key = next(k for k in state if k.endswith("_extra_state"))
    settings = json.loads(bytes(state[key].numpy()))
    if form == "tensor":
        text = json.dumps({**settings, "global_scale": g}).encode()
        state[key] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    else:
        state[key] = {"format": "nvfp4", "n": 2, "k": 32, "global_scale": g}
    want_type, want_msg = _host_error(g)
    other = Nvfp4Linear(Nvfp4Weight(np.zeros_like(packed), np.full_like(scales, 0x38), 2.0))
    before = {k: v.clone() for k, v in other.state_dict().items() if k != key}
    with pytest.raises(want_type) as e:
        other.load_state_dict(state)
    assert str(e.value) == want_msg
    # refused as a whole: no buffer was replaced beside the old global scale
    assert other.global_scale == 2.0
    assert all(other.state_dict()[k].equal(v) for k, v in before.items())


def test_the_validator_names_its_argument_and_is_used_by_the_divisor_path():
    from q2gemv.formats.nvfp4 import check_global_scale, global_scale_from_divisor

    assert check_global_scale(np.array([[0.1]])) == float(np.float32(0.1))
    with pytest.raises(ValueError, match=r"^weight_global_scale: expected a value representable"):
        global_scale_from_divisor(1e39)
    with pytest.raises(TypeError, match=r"^x: expected a real number, got complex"):
        check_global_scale(1j, "x")


# -- 5. fixed-width integer sizes --------------------------------------------------------------


def test_q2_sizes_in_fixed_width_ints_do_not_wrap():
    """np.int16(4000) * 18 wrapped to 6464 (accepted 6464 bytes); 2**40 * ... wrapped to 0."""
    from q2gemv.formats.q2_0 import Q2Weight

    with pytest.raises(ValueError, match=r"^raw: expected exactly 72000 bytes for n=4000 k=64"):
        Q2Weight.from_bytes(bytes(6464), np.int16(4000), np.int16(64), 64)
    want = 2**40 * (2**40 // 128) * 34
    with pytest.raises(ValueError, match=rf"^raw: expected exactly {want} bytes"):
        Q2Weight(np.zeros(0, np.uint8), np.int64(2**40), np.int64(2**40), 128)
    with pytest.raises(ValueError, match=r"^raw: expected exactly 1800 bytes for n=100"):
        Q2Weight.from_bytes(bytes(8), np.int8(100), np.int8(64), np.int8(64))


def test_q2_numpy_int_sizes_give_python_ints_and_the_same_weight():
    from q2gemv.formats.q2_0 import Q2Weight, row_bytes

    w = _q2(3, 128, 64)
    v = Q2Weight.from_bytes(w.raw.tobytes(), np.int8(3), np.uint8(128), np.int16(64))
    assert (type(v.n), type(v.k), type(v.group)) == (int, int, int)
    assert (v.n, v.k, v.group) == (3, 128, 64) and v.raw.tobytes() == w.raw.tobytes()
    assert row_bytes(np.int32(2**31 - 64), np.int8(64)) == (2**31 - 64) // 64 * 18
    assert type(row_bytes(np.int16(128), 64)) is int


def test_quantize_takes_a_numpy_int_group():
    """quantize_q2_0(group=np.int8(64)) raised OverflowError."""
    x = np.random.default_rng(0).standard_normal((2, 128)).astype(np.float32)
    got = quantize_q2_0(x, group=np.int8(64))
    assert got.group == 64 and type(got.group) is int
    assert got.raw.tobytes() == quantize_q2_0(x, group=64).raw.tobytes()


@pytest.mark.parametrize(
    "n,k,exc,needle",
    [
        (np.float32(3), 128, TypeError, r"^n: expected an int, got float32"),
        (3, True, TypeError, r"^k: expected an int, got bool"),
        (np.uint8(0), 128, ValueError, r"^n: expected >= 1, got 0"),
        (2, np.int8(-64), ValueError, r"^k: expected >= 1, got -64"),
    ],
)
def test_q2_size_messages_still_name_the_argument(n, k, exc, needle):
    from q2gemv.formats.q2_0 import Q2Weight

    with pytest.raises(exc, match=needle):
        Q2Weight.from_bytes(bytes(68), n, k, 128)


def test_device_q2_from_buffers_sizes_do_not_wrap():
    from numba import cuda

    from q2gemv.cuda.q2_0 import DeviceQ2Weight

    d = cuda.to_device(np.zeros(6464, np.uint8))
    with pytest.raises(ValueError, match=r"^raw: expected 72000 bytes for n=4000 k=64"):
        DeviceQ2Weight.from_buffers(d, np.int16(4000), np.int16(64), 64)
    w = DeviceQ2Weight.from_buffers(cuda.to_device(np.zeros(36, np.uint8)), np.int8(2), 64, 64)
    assert (type(w.n), type(w.k), type(w.group)) == (int, int, int)


# -- 6. any buffer, through memoryview ----------------------------------------------------------


class _NoDunderBuffer:
    """Mixin: hides ``__buffer__`` (as on Python 3.10/3.11) while the C buffer slot still works."""

    def __getattribute__(self, name):
        if name == "__buffer__":
            raise AttributeError(name)
        return super().__getattribute__(name)


class _OldMmap(_NoDunderBuffer, mmap.mmap):
    pass


class _OldArray(_NoDunderBuffer, array.array):
    pass


def test_from_bytes_takes_a_read_only_file_map_without_a_copy(tmp_path):
    """mmap.mmap raised TypeError on Python 3.10/3.11 (no __buffer__ there)."""
    from q2gemv.formats.q2_0 import Q2Weight

    w = _q2(2, 128, 64)
    p = tmp_path / "raw.bin"
    p.write_bytes(w.raw.tobytes())
    with open(p, "rb") as f:
        for cls in (mmap.mmap, _OldMmap):
            m = cls(f.fileno(), 0, access=mmap.ACCESS_READ)
            assert not hasattr(m, "__buffer__") or cls is mmap.mmap
            v = Q2Weight.from_bytes(m, 2, 128, 64)
            assert v.raw.tobytes() == w.raw.tobytes()
            assert np.shares_memory(v.raw, np.frombuffer(m, np.uint8))  # wrapped, not copied
            with pytest.raises(ValueError):
                v.raw.flags.writeable = True
            del v


@pytest.mark.parametrize("cls", [mmap.mmap, _OldMmap])
def test_from_bytes_copies_a_writeable_map(cls):
    from q2gemv.formats.q2_0 import Q2Weight

    w = _q2(2, 128, 64)
    m = cls(-1, w.nbytes)
    m[:] = w.raw.tobytes()
    v = Q2Weight.from_bytes(m, 2, 128, 64)
    m[:4] = b"\xff\xff\xff\xff"
    assert v.raw.tobytes() == w.raw.tobytes()


@pytest.mark.parametrize("cls", [array.array, _OldArray])
@pytest.mark.parametrize("typecode", ["B", "H", "I"])
def test_from_bytes_takes_an_array_array(cls, typecode):
    """array.array raised TypeError on Python 3.10/3.11; its item size does not matter."""
    from q2gemv.formats.q2_0 import Q2Weight

    w = _q2(2, 128, 64)  # 36 bytes: a whole number of 1-, 2- and 4-byte items
    a = cls(typecode)
    a.frombytes(w.raw.tobytes())
    v = Q2Weight.from_bytes(a, 2, 128, 64)
    assert v.raw.tobytes() == w.raw.tobytes()
    a[0] = 0
    assert v.raw.tobytes() == w.raw.tobytes()  # copied: the array is writeable


def test_from_bytes_refusals_name_raw():
    from q2gemv.formats.q2_0 import Q2Weight

    with pytest.raises(TypeError, match=r"^raw: expected a buffer .*got list"):
        Q2Weight.from_bytes([0] * 36, 2, 128, 64)
    strided = memoryview(bytes(72))[::2]
    with pytest.raises(ValueError, match=r"^raw: expected a C-contiguous buffer"):
        Q2Weight.from_bytes(strided, 2, 128, 64)


# -- 7. copies as immutable as originals; prepared operands fixed -----------------------------


def _weights():
    from q2gemv.formats.nvfp4 import Nvfp4Weight

    nv = Nvfp4Weight.from_float(np.linspace(-2, 5, 96, dtype=np.float32).reshape(3, 32))
    return [("q2", _q2(2, 128, 64), ("raw",)), ("nvfp4", nv, ("packed", "scales"))]


def _copies(w):
    return {
        "pickle": pickle.loads(pickle.dumps(w)),
        "pickle-0": pickle.loads(pickle.dumps(w, protocol=0)),
        "deepcopy": copy.deepcopy(w),
        "copy": copy.copy(w),
    }


@pytest.mark.parametrize("kind", ["q2", "nvfp4"])
def test_copies_of_a_weight_cannot_be_made_writeable(kind):
    """After pickle or deepcopy, raw.flags.writeable = True used to succeed and writes landed."""
    _, w, fields = next(x for x in _weights() if x[0] == kind)
    for how, c in _copies(w).items():
        assert type(c) is type(w), how
        for f in fields:
            arr = getattr(c, f)
            assert arr.tobytes() == getattr(w, f).tobytes(), (how, f)
            with pytest.raises(ValueError):
                arr.flags.writeable = True
            base = arr.base
            while isinstance(base, np.ndarray):  # no view down the chain can be either
                with pytest.raises(ValueError):
                    base.flags.writeable = True
                base = base.base
    if kind == "nvfp4":
        assert all(c.global_scale == w.global_scale for c in _copies(w).values())


def test_a_copy_of_a_nan_global_scale_keeps_its_bits():
    from q2gemv.formats.nvfp4 import Nvfp4Weight

    w = Nvfp4Weight(np.zeros((1, 8), np.uint8), np.zeros((1, 1), np.uint8), float("-nan"))
    got = pickle.loads(pickle.dumps(w)).global_scale
    assert np.float32(got).view(np.uint32) == np.float32(w.global_scale).view(np.uint32)


def test_prepared_bits_cannot_be_made_writeable():
    """prepare(a).bits.flags.writeable = True used to succeed: the bits could then change
    behind the device operands (cuda and reference results differed)."""
    import ml_dtypes

    import q2gemv

    for one_d in (False, True):
        a = np.arange(1, 2 * 64 + 1, dtype=np.float32).reshape(2, 64).astype(ml_dtypes.bfloat16)
        x = a[0] if one_d else a
        p = q2gemv.prepare(x, backend="reference")
        with pytest.raises(ValueError):
            p.bits.flags.writeable = True
        x.view(np.uint16)[...] = 0  # the caller's array does not reach it either
        assert p.bits.all()
    hand = q2gemv.PreparedActivations(np.ones((1, 64), np.uint16), False, "reference")
    with pytest.raises(ValueError):
        hand.bits.flags.writeable = True


# -- 8. tier planning: plan's bounds and type checks, bounded memory ---------------------------


def _tiers():
    from q2gemv.dispatch.nvfp4_tiers import W4a16BatchmTiers

    return W4a16BatchmTiers.resolve([f"w4a16_gemv_batch{w}" for w in (4, 5, 6, 7, 8)])


def test_plan_w4a16_of_the_largest_m_costs_no_memory():
    """plan_w4a16(2**31 - 1, tiers) built a 67-million-entry list (over 2 GiB)."""
    import tracemalloc

    from q2gemv.dispatch.nvfp4_tiers import plan_w4a16

    m = 2**31 - 1
    tracemalloc.start()
    try:
        plan = plan_w4a16(m, _tiers())
        n = len(plan)
        first, last = plan[0], plan[-1]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert n == -(-m // 32)
    assert first == (0, 32, "w4a16_gemv_batch32")
    assert last == (m - 31, 31, "w4a16_gemv_batch32")
    assert plan_w4a16(77, _tiers()) == [
        (0, 32, "w4a16_gemv_batch32"),
        (32, 32, "w4a16_gemv_batch32"),
        (64, 13, "w4a16_gemv_batch16"),
    ]


@pytest.mark.parametrize("m", [2**31, 2**40, np.int64(2**40)])
def test_tier_planning_refuses_m_beyond_plan_bound(m):
    """plan_w4a16(2**40) and explain_tier(2**31) were accepted where q2gemv.plan refuses."""
    import q2gemv
    from q2gemv.dispatch.nvfp4_tiers import explain_tier, plan_w4a16, select_tier
    from q2gemv.formats.nvfp4 import Nvfp4Weight

    w = Nvfp4Weight.from_float(np.ones((1, 16), np.float32))
    with pytest.raises(ValueError) as want:
        q2gemv.plan(w, m)
    for call in (
        lambda: plan_w4a16(m, _tiers()),
        lambda: explain_tier(m, _tiers()),
        lambda: select_tier(m, [True] * 5, True),
        lambda: _tiers().kernel(m),
    ):
        with pytest.raises(ValueError) as got:
            call()
        assert str(got.value) == str(want.value)


def test_explain_tier_of_the_largest_m_is_short():
    from q2gemv.dispatch.nvfp4_tiers import explain_tier

    text = explain_tier(2**31 - 1, _tiers())
    assert "67108864 launches in all" in text and len(text) < 4000


@pytest.mark.parametrize("bad", ["no", "", 1, 0, 1.0, [True]])
def test_exact_m_must_be_a_bool(bad):
    """plan_w4a16(exact_m="no") treated the string as True (exact-M tiers on)."""
    from q2gemv.dispatch.nvfp4_tiers import plan_w4a16

    t = _tiers()
    for call in (
        lambda: plan_w4a16(5, t, exact_m=bad),
        lambda: t.kernel(5, exact_m=bad),
        lambda: t.width(5, exact_m=bad),
    ):
        with pytest.raises(TypeError, match=r"^exact_m: expected a bool or None, got"):
            call()


def test_tier_planning_argument_types():
    from q2gemv.dispatch.nvfp4_tiers import explain_tier, plan_w4a16

    t = _tiers()
    assert plan_w4a16(5, t, exact_m=np.bool_(True)) == [(0, 5, "w4a16_gemv_batch5")]
    assert plan_w4a16(5, t, exact_m=False) == [(0, 5, "w4a16_gemv_batch8")]
    assert plan_w4a16(np.int16(33), t) == [
        (0, 32, "w4a16_gemv_batch32"),
        (32, 1, "w4a16_gemv_batch4"),
    ]
    for bad in (True, np.bool_(False), 3.0, "4"):
        with pytest.raises(TypeError, match=r"^m: expected an int"):
            plan_w4a16(bad, t)
        with pytest.raises(TypeError, match=r"^m: expected an int"):
            explain_tier(bad, t)
    with pytest.raises(TypeError, match=r"^tiers: expected a W4a16BatchmTiers, got str"):
        explain_tier(4, "tiers")

"""benchmarks/bench_decode.py on the CPU: its arguments, the --smoke run, the decode step under
torch.compile (aot_eager: eager's ops, so eager's bits), and the dated default --out.

Times nothing (benchmarks are scripts); the H200 run is docs/benchmarks.md's.
"""

from __future__ import annotations

import csv
import importlib.util
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_decode.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_decode", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_arguments_and_dated_default_out():
    bench = _bench()
    args = bench.parse_args([])
    assert args.batches == (1, 4, 8, 16, 32) and args.layers == 32
    assert args.variants == bench.VARIANTS
    assert args.out == ROOT / "benchmarks" / "results" / f"{date.today().isoformat()}_decode"
    args = bench.parse_args(["--variants", "q2_0", "--layers", "4", "--batches", "2,8"])
    assert args.variants == ("bf16", "q2_0")  # the baseline is always run
    assert (args.layers, args.batches) == (4, (2, 8))
    smoke = bench.parse_args(["--smoke"])
    assert (smoke.layers, smoke.batches) == (2, (1, 2))
    assert bench.parse_args(["--dry-run"]).smoke  # the old flag's name still works
    for bad in (["--variants", "int3"], ["--batches", "0"], ["--batches", "a"], ["--max-len", "8"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_smoke_run_on_the_cpu(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "decode.csv") as f:
        rows = list(csv.DictReader(f))
    got = {(r["variant"], r["batch"]): r for r in rows}
    for variant in ("bf16", "q2_0", "nvfp4"):
        for batch in ("1", "2"):
            row = got[variant, batch]
            assert row["status"] == "ok" and float(row["ms_per_step"]) > 0, row
            assert row["mode"] == "eager" and row["smoke"] == "1"
    for peer in ("gemlite_a16w2", "gemlite_a16w4", "tinygemm_int4"):
        assert got[peer, "1"]["status"] == "not run: needs CUDA"
    assert (
        "fused groups a layer: 2" in got["q2_0", "1"]["note"]
    )  # quantize_model fused q/k/v, gate/up
    assert (tmp_path / "run.json").exists()
    assert proc.stdout.rstrip().splitlines()[-1].startswith("tinygemm_int4")  # the table last


def test_the_decode_step_compiles_to_one_graph_with_eager_bits():
    torch = pytest.importorskip("torch")
    bench = _bench()
    args = bench.parse_args(["--smoke"])
    model = bench.build_model(args, torch.device("cpu"))
    layers, _ = bench.variant_layers(list(model.model.layers), "q2_0", args, torch.device("cpu"))
    model.model.layers = torch.nn.ModuleList(layers)
    step = bench._decode_step_class()(model, 2, args.max_len)
    step.prefill(args.prompt)
    torch._dynamo.reset()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    assert bench.bits_check(compiled, step) == "equal"
    with torch.no_grad():
        compiled()
        assert int(step.pos) == args.prompt + 1
        assert int(step.cache.layers[0].cumulative_length) == args.prompt + 1
    step.rewind()  # in place: the buffers keep their addresses
    assert int(step.pos) == args.prompt
    assert int(step.cache.layers[0].cumulative_length) == args.prompt
    names = dict(step.named_buffers())
    assert step.cache.layers[0].keys is names["cache_0_keys"]  # the cache is the module's buffers

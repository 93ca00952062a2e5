"""benchmarks/bench_api.py --dry-run: the API benchmark's code path in the simulator (tiny shapes)."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_api.py"


def test_bench_api_dry_run_writes_csv(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_api", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--dry-run", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader((tmp_path / "api_host_dry_run.csv").open()))
    assert [(r["case"], r["numerics"]) for r in rows] == [
        ("q2_0_g128", "exact"),
        ("q2_0_g128", "seed"),
        ("nvfp4", "exact"),
        ("nvfp4", "seed"),
    ]
    assert all(float(r["host_us"]) > 0 and r["device"] == "simulator" for r in rows)
    assert "host_us" in capsys.readouterr().out

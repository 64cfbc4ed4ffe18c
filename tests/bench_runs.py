"""Runs a bench script as its users do, with no GPU visible: the benches' smoke tests."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_bench(tmp_path: Path, script: str, *args: str, timeout: int = 600,
              env: dict | None = None) -> tuple[dict, str]:
    """`python bench/SCRIPT ARGS --json FILE` run in `tmp_path`; (the JSON it wrote, what it
    printed). A non-zero exit fails the test with the tail of its output."""
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args, "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(out.read_text()), run.stdout

"""1,200 seeded random mutations of XC text, converted chunks and checkpoint folders, in
a subprocess (see ``tests/fuzz_inputs.py``): each is read correctly or refused with the
project's own error; no crash, no hang, no allocation sized by a damaged number."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Growth of the peak RSS allowed beyond the inputs: interpreter and allocator noise.
SLACK_BYTES = 96 << 20


def test_fuzz_inputs(tmp_path: Path):
    out = tmp_path / "fuzz.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fuzz_inputs", "20240613", "1200", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]  # a segfault is -11 here
    stats = json.loads(out.read_text())
    assert sum(stats["kinds"].values()) == 1200
    model_bytes = 3 * 4 * (20 * 8 + 8 + 5 * 9)  # the fuzzed model: 20 features, 8 hidden, 5 labels
    bound = 2 * stats["biggest_file"] + model_bytes + SLACK_BYTES
    assert stats["peak_rss"] - stats["base_rss"] < bound, stats

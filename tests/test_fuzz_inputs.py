"""1,200 seeded random mutations of XC text, converted chunks, checkpoint folders, run
configs (YAML anchors and aliases among the edits) and model folders with a link out, in
a subprocess (see ``tests/fuzz_inputs.py``): each is read correctly or refused with the
project's own error; no crash, no hang, no allocation sized by a damaged number, no byte
written through a link."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

#: Slow: 1,200 damaged inputs in a subprocess (~20-35 s).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
#: Growth of the peak RSS allowed beyond the inputs: interpreter and allocator noise.
SLACK_BYTES = 96 << 20


def test_fuzz_inputs(tmp_path: Path):
    out = tmp_path / "fuzz.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fuzz_inputs", "20240613", "1200", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]  # a segfault is -11 here
    stats = json.loads(out.read_text())
    assert stats["kinds"] == dict.fromkeys(["text", "chunks", "checkpoint", "config", "links"], 240)
    model_bytes = 3 * 4 * (20 * 8 + 8 + 5 * 9)  # the fuzzed model: 20 features, 8 hidden, 5 labels
    bound = 2 * stats["biggest_file"] + model_bytes + SLACK_BYTES
    assert stats["peak_rss"] - stats["base_rss"] < bound, stats

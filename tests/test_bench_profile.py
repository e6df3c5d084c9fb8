"""``dslide bench profile``: each phase charged its own time, the phases adding up to the
step, the shared negatives' phases there when the batch shares them."""

import json
from pathlib import Path

import pytest

from dslide_workflows.bench import profile
from tests.test_cli import run


def test_a_phase_inside_another_is_charged_only_its_own_time(monkeypatch):
    ticks = iter([0.0, 1.0, 3.0, 10.0])  # outer starts, inner starts, inner ends, outer ends
    monkeypatch.setattr(profile.time, "perf_counter", lambda: next(ticks))
    clock = profile.PhaseClock()
    inner = clock.timed("inner", lambda: None)
    outer = clock.timed("outer", inner)
    outer()
    assert clock.seconds == {"inner": 2.0, "outer": 8.0}


@pytest.mark.parametrize("negatives", ["example", "shared"])
def test_profile_of_a_tiny_run(capsys, tmp_path: Path, negatives: str):
    out_json = tmp_path / "profile.json"
    argv = ["bench", "profile", "--preset", "tiny", "--points", "2000", "--batch-size", "64"]
    argv += ["--steps", "6", "--warmup", "2", "--cache-dir", str(tmp_path)]
    argv += ["--engine-opt", f"negatives={negatives}", "--json", str(out_json)]
    code, out, _ = run(capsys, *argv)
    assert code == 0, out
    result = json.loads(out_json.read_text())
    phases = result["phases"]
    for name in ("active sets", "logits and softmax sums", "output rows: Adam and backprop"):
        assert phases[name] > 0, name
    assert ("shared negatives: Adam" in phases) == (negatives == "shared")
    assert sum(phases.values()) == pytest.approx(result["ms_per_step"] / 1e3, rel=1e-6)
    assert "output rows: Adam and backprop" in out and "samples/s" in out

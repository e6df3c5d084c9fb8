"""``dslide plan``: the memory a run would take on each worker, without training."""

from pathlib import Path

import pytest

from dslide_dask.data.synthetic import make_synthetic
from dslide_dask.data.xc_text import write_xc

from .test_cli import assert_usage_error, run


def test_the_billion_parameter_preset_fits_four_workers_but_not_one(capsys):
    """amazon-3m at hidden 256 (0.81 billion parameters): split over this machine's
    LocalCluster of four its network fits (its fused parts on one worker do not); one
    worker of 6 GiB cannot hold it, which the plan says with the numbers, and exits 1,
    before anything is allocated."""
    whole = ["plan", "--preset", "amazon-3m", "--hidden", "256"]
    code, out, _ = run(capsys, *whole, "--workers", "4", "--memory-limit", "6GiB")
    # the fused parts of 1.72M rows on one worker do not fit (docs/architecture.md)
    assert code == 1 and "neighbours=0 (the network alone, without the" in out, out
    plan = [*whole, "--opt", "neighbours=0"]  # the network: split over four, it fits
    code, out, _ = run(capsys, *plan, "--workers", "4", "--memory-limit", "6GiB")
    assert code == 0, out
    assert "809,045,625 parameters" in out and "fits" in out
    assert out.count("local-worker-") == 4 and "hidden layers, shard 0" in out
    code, out, _ = run(capsys, *plan, "--workers", "1", "--memory-limit", "6GiB")
    assert code == 1
    assert "does not fit 1 worker(s)" in out and "over 80% of its limit" in out
    assert "2 or more workers like these (6.00 GiB)" in out
    assert 'moment_dtype="bfloat16" (half-size Adam state): 5.58 GiB in all, not enough' in out
    # half-size Adam state: two such workers are enough
    half = ["--opt", "moment_dtype=bfloat16"]
    code, out, _ = run(capsys, *plan, "--workers", "2", "--memory-limit", "6GiB", *half)
    assert code == 0 and "fits" in out, out


def test_the_shape_comes_from_the_data_files_header(capsys, tmp_path: Path):
    train, _ = make_synthetic("tiny", seed=0)
    path = tmp_path / "train.txt"
    write_xc(path, train)
    code, out, _ = run(capsys, "plan", "--train", str(path), "--workers", "2")
    assert code == 0, out
    assert f"{train.n_features:,} features" in out and f"{train.n_labels:,} labels" in out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--memory-limit", "lots"], ["lots"]),
        (["--in-process"], ["--in-process"]),
    ],
)
def test_bad_plan_flags_are_one_line(capsys, argv, words):
    assert_usage_error(capsys, ["plan", "--preset", "tiny", *argv], *words)

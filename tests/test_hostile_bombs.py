"""Hostile input, second round: small inputs that cost a lot. YAML whose anchors and
aliases stand for a billion strings, or whose tags would build objects, in a config
file, in flags or in a resumed run's config.yaml; gzip files that decompress to far more
than they weigh. Each ends in one line ``dslide: error: ...`` (exit 2, at most 300
characters) naming the file or the parameter, quickly and in little memory.

The second round goes on in test_hostile_secrets (secrets by their shape) and
test_hostile_scheduler (a scheduler that never answers).
"""

from __future__ import annotations

import gzip
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest

from dslide_workflows import cli
from tests.hostile import FAST, TRAIN, one_error, work_folder


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path as the working directory, holding a small training file t.txt."""
    return work_folder(tmp_path, monkeypatch)


# -- 3. YAML anchors and aliases ---------------------------------------------------------------
def _alias_bomb(depth: int) -> bytes:
    """``storage_options`` whose aliases stand for 9**depth strings (a billion laughs)."""
    lines = ["storage_options:", "  a0: &a0 [" + ", ".join(["xxxxxxxx"] * 9) + "]"]
    for d in range(1, depth):
        lines.append(f"  a{d}: &a{d} [" + ", ".join([f"*a{d - 1}"] * 9) + "]")
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.timeout(60)
def test_yaml_alias_bomb_is_refused(capsys, work):
    (work / "c.yaml").write_bytes(_alias_bomb(9))
    t0 = time.monotonic()
    one_error(
        capsys,
        ["train", *FAST, "--train", "t.txt", "--config", "c.yaml"],
        "c.yaml:2: not valid YAML (anchors and aliases",
    )
    assert time.monotonic() - t0 < 20
    assert not (work / "runs").exists()


@pytest.mark.parametrize(
    "text,expected",
    [
        (b"epochs: &n 2\nbatch_size: *n\n", "c.yaml:1: not valid YAML (anchors and aliases"),
        (b"epochs: !!python/object:os.system x\n", "c.yaml:1: not valid YAML (could not determine"),
        (b"epochs: !foo 2\n", "c.yaml:1: not valid YAML (could not determine a constructor"),
    ],
)
def test_yaml_aliases_and_tags_in_config(capsys, work, text, expected):
    (work / "c.yaml").write_bytes(text)
    one_error(capsys, ["train", *FAST, "--train", "t.txt", "--config", "c.yaml"], expected)


@pytest.mark.parametrize(
    "flag,value,expected",
    [
        ("--opt", "lr=!!python/object:os.system x", "argument --opt: cannot parse the value of"),
        ("--opt", "hidden=[&w 8, *w]", "anchors and aliases"),
        ("--storage-option", "a=[&x [1, 1], [*x, *x]]", "argument --storage-option:"),
    ],
)
def test_yaml_aliases_and_tags_in_flags(capsys, work, flag, value, expected):
    one_error(capsys, ["train", *FAST, "--train", "t.txt", flag, value], expected)


def test_resumed_config_with_aliases(capsys, work):
    assert cli.main(["train", *FAST, "--train", "t.txt", "--run-dir", "run"]) == 0
    capsys.readouterr()
    config = work / "run" / "config.yaml"
    config.write_bytes(config.read_bytes() + _alias_bomb(9).replace(b"storage_options:", b"bomb:"))
    one_error(
        capsys,
        ["train", "--resume", "run", "--in-process", "--epochs", "2"],
        "config.yaml:",
        "anchors and aliases",
    )


# -- 4. gzip bombs -----------------------------------------------------------------------------
def _gzip_flood(head: bytes, blank_bytes: int, tail: bytes = b"") -> bytes:
    """``head``, then ``blank_bytes`` newlines, then ``tail``, gzip-compressed without
    holding the flood."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [z.compress(head)]
    block = b"\n" * (1 << 20)
    for start in range(0, blank_bytes, len(block)):
        out.append(z.compress(block[: min(len(block), blank_bytes - start)]))
    out += [z.compress(tail), z.flush()]
    return b"".join(out)


def test_gzip_bomb_is_refused_at_max_decompressed(capsys, work):
    (work / "bomb.txt.gz").write_bytes(_gzip_flood(TRAIN, 8 << 20))
    line, _ = one_error(
        capsys,
        ["train", *FAST, "--train", "bomb.txt.gz", "--max-decompressed", "1MB"],
        "bomb.txt.gz: decompresses to more than 1,000,000 bytes",
        "--max-decompressed",
    )


def test_gzip_bomb_limit_from_the_config_file(capsys, work):
    (work / "bomb.txt.gz").write_bytes(_gzip_flood(TRAIN, 4 << 20))
    (work / "c.yaml").write_bytes(b"max_decompressed: 2MiB\n")
    one_error(
        capsys,
        ["train", *FAST, "--train", "bomb.txt.gz", "--config", "c.yaml"],
        "bomb.txt.gz: decompresses to more than 2,097,152 bytes",
    )


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--max-decompressed", "lots"], "argument --max-decompressed: expected a size"),
        (["--max-decompressed", "0"], "argument --max-decompressed: expected a size"),
    ],
)
def test_bad_max_decompressed(capsys, work, argv, expected):
    one_error(capsys, ["train", *FAST, "--train", "t.txt", *argv], expected)


def test_bad_max_decompressed_in_config(capsys, work):
    (work / "c.yaml").write_bytes(b"max_decompressed: lots\n")
    one_error(
        capsys,
        ["train", *FAST, "--train", "t.txt", "--config", "c.yaml"],
        "c.yaml: max_decompressed must be a number of bytes",
    )


def test_blank_flood_costs_no_memory(work):
    """64 MiB of trailing newlines (64 kB of gzip) read in well under 8 MB, the point
    kept; the default limit (a share of free memory) lets it through."""
    from dslide_dask.data.source import open_source, read_partition

    (work / "warm.txt.gz").write_bytes(_gzip_flood(b"1 20 5\n0 1:1\n", 10))
    read_partition(*open_source(str(work / "warm.txt.gz")).partitions)  # compiled first:
    # numba's compiler allocates megabytes the first time on a cold cache (a fresh machine)
    (work / "flood.txt.gz").write_bytes(_gzip_flood(b"1 20 5\n0 1:1\n", 64 << 20))
    (part,) = open_source(str(work / "flood.txt.gz")).partitions
    tracemalloc.start()
    try:
        data, skipped = read_partition(part)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (len(data), skipped) == (1, 0)
    assert peak < 8 << 20, peak


def test_blank_flood_then_text_is_reported_as_uncompressed(work):
    """Text after a long run of blank lines: the same error, at the same line, as the
    uncompressed file (the flood is read again exactly)."""
    from dslide_dask.data.source import read_dataset
    from dslide_dask.data.xc_text import XCFormatError

    head, tail = b"2 20 5\n0 1:1\n", b"1 2:1\n"
    (work / "f.txt.gz").write_bytes(_gzip_flood(head, 300_000, tail))
    (work / "f.txt").write_bytes(head + b"\n" * 300_000 + tail)
    problems = []
    for name in ("f.txt", "f.txt.gz"):
        with pytest.raises(XCFormatError) as err:
            read_dataset(str(work / name))
        problems.append((err.value.line, err.value.problem))
    assert problems[0] == problems[1]
    assert problems[0][0] == 3


def test_decompress_is_bounded_for_every_reader():
    """The bound sits in the one function every whole-file read goes through."""
    from dslide_dask.data.xc_text import XCFormatError, decompress

    raw = gzip.compress(b"9" * 100_000)
    with pytest.raises(XCFormatError, match=r"x\.gz: decompresses to more than 1,000 bytes"):
        decompress(raw, "x.gz", "gzip", max_bytes=1000)
    assert len(decompress(raw, "x.gz", "gzip", max_bytes=100_000)) == 100_000

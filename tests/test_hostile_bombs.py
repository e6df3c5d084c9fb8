"""Hostile input, second round: small inputs that cost a lot, secrets by their shape, and
a scheduler that never answers. Each ends in one line ``dslide: error: ...`` (exit 2,
at most 300 characters) naming the file or the parameter, quickly and in little memory,
never a secret."""

from __future__ import annotations

import gzip
import socket
import threading
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest

from dslide_workflows import cli
from dslide_workflows.secrets import mask, mask_text
from tests.hostile import FAST, TRAIN, failed_once

ON_CLUSTER = [f for f in FAST if f != "--in-process"]


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    monkeypatch.delenv("DSLIDE_DEBUG", raising=False)
    (tmp_path / "t.txt").write_bytes(TRAIN)
    return tmp_path


def one_error(capsys, argv: list[str], *expected: str) -> tuple[str, str]:
    """``dslide argv`` fails: exit 2, one line naming what ``expected`` says; (line, out)."""
    line, out = failed_once(capsys, argv)
    assert line.startswith("dslide: error: ") and len(line) <= 300, line
    assert "Traceback" not in out + line
    for text in expected:
        assert text in line, line
    return line, out


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


# -- 5. secrets by their shape -----------------------------------------------------------------
@pytest.mark.parametrize(
    "text,secrets",
    [
        (
            "https://b.s3.amazonaws.com/t.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential="
            "AKIAEXAMPLE%2F20240101&X-Amz-Expires=3600&X-Amz-Security-Token=FwoTOKEN&"
            "X-Amz-Signature=0123abcdSIG",
            ["AKIAEXAMPLE", "FwoTOKEN", "0123abcdSIG"],
        ),
        (
            "https://acct.blob.core.windows.net/c/t.txt?sv=2022-11-02&sp=r&se=2030-01-01&"
            "sig=AbC%2BdEfSIG%3D",
            ["AbC%2BdEfSIG"],
        ),
        ("https://storage.googleapis.com/b/t.txt?X-Goog-Signature=ffeeGOOGSIG&x=1", ["ffeeGOOG"]),
        (
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=c2VjcmV0S2V5PT0=;"
            "EndpointSuffix=core.windows.net",
            ["c2VjcmV0S2V5PT0"],
        ),
        (
            "BlobEndpoint=https://a.blob.core.windows.net/;SharedAccessSignature=sv=2022&ss=b&"
            "sig=XYZsasSIG",
            ["XYZsasSIG", "sv=2022"],
        ),
        ("Server=tcp:db;User ID=u;Password=p@ss/w0rdX;Encrypt=true", ["p@ss/w0rdX", "w0rdX"]),
        ("cannot open 'http://user:pa/ss/w0rd@127.0.0.1:1/t.txt'", ["pa/ss", "w0rd"]),
        ("s3://AKIAUSER:sec/ret+KEY@bucket/t.txt", ["sec/ret", "ret+KEY"]),
    ],
)
def test_secrets_masked_by_their_shape(text, secrets):
    masked = mask_text(text)
    for secret in secrets:
        assert secret not in masked, masked
    assert "***" in masked
    assert mask({"nested": [text]}) == {"nested": [masked]}


@pytest.mark.parametrize(
    "text",
    [
        "expected key=value, got 'lr'",
        "http://127.0.0.1:8787/status",
        "s3://b/k=v/t.txt",
        "https://h/t.txt?sv=2022&se=2030&sp=r",
        "tcp://127.0.0.1:8786",
    ],
)
def test_plain_texts_stay_readable(text):
    assert mask_text(text) == text


def test_unset_secrets_show_as_unset():
    assert mask({"tls_key": None, "key": "", "token": "abc"}) == {
        "tls_key": None,
        "key": "",
        "token": "***",
    }


def test_secrets_in_values_never_printed_nor_written(capsys, work):
    """A presigned URL as --train, an Azure connection string and a SAS token as
    storage options: not on stdout or stderr, not in the run folder."""
    secrets = ["SIGSECRET1", "AKIACRED1", "ACCKEYSECRET", "SASSECRET99"]
    name = "t.txt?X-Amz-Credential=AKIACRED1&X-Amz-Signature=SIGSECRET1"
    (work / name).write_bytes(TRAIN)
    connection = "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=ACCKEYSECRET==;"
    connection += "EndpointSuffix=x"
    argv = ["train", *FAST, "--verbose", "--train", name, "--run-dir", "run"]
    argv += ["--storage-option", f"connection_string={connection}"]
    argv += ["--storage-option", "sas=SASSECRET99"]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert "tls_key: null" in out  # unset, not '***'
    texts = [out, err] + [
        p.read_bytes().decode("latin-1") for p in (work / "run").rglob("*") if p.is_file()
    ]
    for secret in secrets:
        for text in texts:
            assert secret not in text
    assert "X-Amz-Signature=***" in (work / "run" / "config.yaml").read_text()


def test_presigned_url_and_slash_password_in_errors(capsys, work):
    line, _ = one_error(
        capsys, ["train", *FAST, "--train", "missing.txt?X-Amz-Signature=SIGSECRET2&sig=AZSIG3"]
    )
    assert "SIGSECRET2" not in line and "AZSIG3" not in line
    pytest.importorskip("aiohttp")
    argv = ["train", *FAST, "--train", "http://u:pa/ss9@127.0.0.1:1/t.txt"]
    line, _ = one_error(capsys, [*argv, "--storage-option", "key=AKIAKEY1"], "127.0.0.1:1")
    assert "pa/ss9" not in line and "AKIAKEY1" not in line


# -- 6. a scheduler that never answers ---------------------------------------------------------
@pytest.fixture
def silent_scheduler():
    """A socket on 127.0.0.1 that accepts connections and never says a word."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    held, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


def _refused_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"  # closed once returned: refused


@pytest.mark.timeout(60)
def test_train_against_a_silent_scheduler(capsys, work, silent_scheduler):
    t0 = time.monotonic()
    argv = ["train", *ON_CLUSTER, "--train", "t.txt", "--run-dir", "run"]
    argv += ["--scheduler-address", silent_scheduler, "--connect-timeout", "1"]
    one_error(
        capsys,
        argv,
        f"--scheduler-address {silent_scheduler}: no answer within 1 s (--connect-timeout)",
    )
    assert time.monotonic() - t0 < 15


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_plan_against_a_silent_scheduler(capsys, work, silent_scheduler):
    (work / "c.yaml").write_bytes(b"connect_timeout: 1.5\n")
    one_error(
        capsys,
        ["plan", "--train", "t.txt", "--config", "c.yaml", "--scheduler-address", silent_scheduler],
        silent_scheduler,
        "within 1.5 s (--connect-timeout)",
    )


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_predict_against_a_silent_scheduler(capsys, work, silent_scheduler):
    assert cli.main(["train", *FAST, "--train", "t.txt", "--run-dir", "run"]) == 0
    capsys.readouterr()
    t0 = time.monotonic()
    argv = ["predict", "run", "t.txt", "out", "--no-progress"]
    argv += ["--scheduler-address", silent_scheduler, "--connect-timeout", "1"]
    one_error(capsys, argv, silent_scheduler, "within 1 s (--connect-timeout)")
    assert time.monotonic() - t0 < 15


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", [pytest.param("silent", marks=pytest.mark.slow), "refused"])
def test_leave_ends_within_its_timeout(capsys, work, silent_scheduler, kind):
    address = silent_scheduler if kind == "silent" else _refused_address()
    t0 = time.monotonic()
    one_error(
        capsys,
        ["leave", "--scheduler-address", address, "--worker", "w", "--timeout", "2"],
        address,
        "within 2 s (--timeout)",
    )
    assert time.monotonic() - t0 < 2 + 3


def test_connect_timeout_default_and_range(capsys, work):
    from dslide_workflows.security import CONNECT_TIMEOUT

    assert CONNECT_TIMEOUT <= 20  # train, predict and leave end within 30 s by default
    (work / "c.yaml").write_bytes(b"connect_timeout: -1\n")
    argv = ["train", *ON_CLUSTER, "--train", "t.txt", "--config", "c.yaml"]
    argv += ["--scheduler-address", "tcp://127.0.0.1:1"]
    one_error(capsys, argv, "c.yaml: connect_timeout must be a number in")
    argv = ["leave", "--scheduler-address", "tcp://127.0.0.1:1", "--worker", "w"]
    argv += ["--connect-timeout", "0"]
    one_error(capsys, argv, "--connect-timeout must be in (0, 86400]")


def test_resume_takes_a_masked_url_again(capsys, work):
    """config.yaml holds the presigned URL masked: a resumed run is given it again (the
    same URL but for its secrets), and nothing else."""
    name = "t.txt?X-Amz-Signature=SIGSECRET4"
    (work / name).write_bytes(TRAIN)
    base = ["train", "--resume", "run", "--in-process", "--no-progress", "--epochs", "2"]
    argv = ["train", *FAST, "--train", name, "--run-dir", "run", "--checkpoint-every", "1"]
    assert cli.main(argv) == 0
    capsys.readouterr()
    one_error(capsys, base, "train was saved with its secrets masked", "--train")
    one_error(capsys, [*base, "--train", "t.txt"], "masked")
    assert cli.main([*base, "--train", name]) == 0
    assert "SIGSECRET4" not in (work / "run" / "config.yaml").read_text()

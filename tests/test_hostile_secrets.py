"""Hostile input, second round: secrets by their shape. Presigned URLs, SAS tokens,
connection strings and passwords in URLs are masked wherever they would be shown, so
they are never printed nor written to the run folder, also in the one line ``dslide:
error: ...`` (exit 2) of a failure; plain texts stay readable, and a resumed run whose
URL was saved masked asks to be given it again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dslide_workflows import cli
from dslide_workflows.secrets import mask, mask_text
from tests.hostile import FAST, TRAIN, one_error, work_folder


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path as the working directory, holding a small training file t.txt."""
    return work_folder(tmp_path, monkeypatch)


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

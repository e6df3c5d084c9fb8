"""``dslide train`` end to end: config file and flags, LocalCluster or in-process."""

import pytest

from dslide_workflows.cli import main


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    assert main(["generate", "tiny", "--out", str(out)]) == 0
    return out / "train.txt", out / "test.txt"


def test_train_on_a_local_cluster_from_urls(tiny_files, tmp_path, capsys):
    train, test = tiny_files
    config = tmp_path / "run.yaml"
    config.write_text(
        f"train: file://{train}\ntest: {test}\nepochs: 4\nworkers: 2\nmodel:\n  hidden: [64]\n"
    )
    report = tmp_path / "report.html"
    status = main(["train", "--config", str(config), "--eval-every", "40", "--no-progress",
                   "--performance-report", str(report)])  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0
    assert "LocalCluster of 2 worker processes" in out
    assert "shards          2:" in out
    assert "eval step 40" in out
    p1 = float(out.split("test            P@1 ")[1].split()[0])
    assert p1 > 0.3, out
    assert report.stat().st_size > 10_000


def test_train_in_process_on_a_preset(capsys):
    status = main(["train", "--preset", "tiny", "--in-process", "--epochs", "2",
                   "--opt", "hidden=[32]", "--opt", "lr=2e-2", "--no-progress"])  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0
    assert "lr: 0.02" in out and "hidden: [32]" in out
    assert "test            P@1" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preset", "tiny", "--train", "x.txt"], "give exactly one of --train URL or --preset"),
        (["--preset", "tiny", "--opt", "L=0"], r"L must be an integer in [1, 1024], got 0"),
        (["--preset", "tiny", "--opt", "Q=1"], "unknown parameter(s) ['Q']"),
        (["--train", "/nonexistent/train.txt"], "/nonexistent/train.txt"),
    ],
)
def test_bad_settings_exit_2_with_one_line(argv, message, capsys):
    assert main(["train", "--in-process", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dslide: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_skip_bad_lines_counts_instead_of_stopping(tmp_path, capsys):
    good = "1:0.5 3:1.0"
    lines = [f"{i % 3} {good}" for i in range(40)]
    lines[7] = "9 1:0.5"  # label 9 >= 5 labels
    lines[20] = "1 3:nan"
    path = tmp_path / "train.txt"
    path.write_text("40 10 5\n" + "\n".join(lines) + "\n")
    argv = ["train", "--in-process", "--train", str(path), "--batch-size", "8", "--no-progress",
            "--opt", "hidden=[8]", "--opt", "bin_size=4"]  # fmt: skip
    assert main(argv) == 2
    assert f"{path}:9: label id 9 >= n_labels 5" in capsys.readouterr().err
    assert main([*argv, "--skip-bad-lines"]) == 0
    assert "38 in 5 steps; 2 bad lines skipped" in capsys.readouterr().out

"""``dslide train`` end to end: config file and flags, LocalCluster or in-process, run
folders, resume and ``dslide report``."""

import json
import shutil

import numpy as np
import pytest
import yaml

from dslide_dask import SlideClassifier
from dslide_dask.data.synthetic import make_synthetic
from dslide_workflows.cli import main

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    """Default run folders (./runs/...) land in the test's own folder."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    assert main(["generate", "tiny", "--out", str(out)]) == 0
    return out / "train.txt", out / "test.txt"


@pytest.mark.slow
def test_train_on_a_local_cluster_from_urls(tiny_files, tmp_path, capsys):
    train, test = tiny_files
    config = tmp_path / "run.yaml"
    config.write_text(
        f"train: file://{train}\ntest: {test}\nepochs: 4\nworkers: 2\nmodel:\n  hidden: [64]\n"
    )
    report = tmp_path / "report.html"
    argv = ["train", "--config", str(config), "--eval-every", "40", "--no-progress"]
    status = main([*argv, "--performance-report", str(report)])
    out = capsys.readouterr().out
    assert status == 0
    assert "LocalCluster of 2 worker processes" in out
    assert "shards          2:" in out
    assert "eval step 40" in out
    p1 = float(out.split("test            P@1 ")[1].split()[0])
    assert p1 > 0.3, out
    assert report.stat().st_size > 10_000
    (run,) = (tmp_path / "runs").iterdir()  # the default run folder: runs/DATE-TIME-train
    assert run.name.endswith("-train")
    assert {p.name for p in run.iterdir()} == {
        "config.yaml",
        "metrics.jsonl",
        "curves.png",
        "model",
        "summary.json",
        "summary.txt",
        "run.json",
    }
    summary = json.loads((run / "summary.json").read_text())
    assert summary["shards"] == 2 and summary["test"]["P@1"] == p1
    assert (run / "curves.png").read_bytes().startswith(PNG)


def test_train_in_process_on_a_preset(capsys):
    argv = ["train", "--preset", "tiny", "--in-process", "--epochs", "2"]
    status = main([*argv, "--opt", "hidden=[32]", "--opt", "lr=2e-2", "--no-progress"])
    out = capsys.readouterr().out
    assert status == 0
    assert "model: 2,000 -> 32 -> 1,000 (97,032 parameters)" in out  # 2000*32+32 + 32*1000+1000
    assert "lr: 0.02" not in out  # the settings are in config.yaml, printed with --verbose
    assert "test            P@1" in out


def test_verbose_prints_every_setting(capsys, tmp_path):
    run = ["--run-dir", str(tmp_path / "run"), "--verbose", "--no-progress"]
    argv = ["train", "--preset", "tiny", "--in-process", "--epochs", "1", "--opt", "lr=2e-2", *run]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "lr: 0.02" in out and "tls_key: null" in out
    assert "lr: 0.02" in (tmp_path / "run" / "config.yaml").read_text()


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
    argv = ["train", "--in-process", "--train", str(path), "--batch-size", "8", "--no-progress"]
    argv += ["--opt", "hidden=[8]", "--opt", "bin_size=4"]
    assert main(argv) == 2
    assert f"{path}:9: label id 9 >= n_labels 5" in capsys.readouterr().err
    assert main([*argv, "--skip-bad-lines"]) == 0
    assert "38 in 5 steps; 2 bad lines skipped" in capsys.readouterr().out


def steps_of(run) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_a_run_folder_holds_config_metrics_plot_model_and_summary(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--preset", "tiny", "--in-process", "--epochs", "2", "--no-progress"]
    argv += ["--opt", "hidden=[32]", "--eval-every", "20", "--run-dir", str(run)]
    argv += ["--storage-option", "secret=hunter2"]
    argv += ["--opt", "neighbours=0"]  # every row trains the network: 2 epochs of 20 steps
    assert main(argv) == 0
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["model"]["hidden"] == [32] and config["epochs"] == 2
    assert config["storage_options"] == {"secret": "***"}  # never written down
    records = steps_of(run)
    steps = [r["step"] for r in records if r["kind"] == "step"]
    assert steps == list(range(1, 41))  # 2 epochs of 20 batches
    evals = [r for r in records if r["kind"] == "eval"]
    assert [e["step"] for e in evals] == [20, 40]
    assert (run / "curves.png").read_bytes().startswith(PNG)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 40 and summary["test"]["P@1"] == evals[-1]["P@1"]
    clf = SlideClassifier.load(str(run / "model"))  # the final model
    test = make_synthetic("tiny", seed=0)[1].slice(0, 2000)  # --eval-points default
    assert clf.score(test.X, test.Y) == pytest.approx(summary["test"]["P@1"])
    assert main(argv) == 2  # never over another run
    assert "already holds a run: --resume" in capsys.readouterr().err


def test_resume_carries_a_run_on_from_its_latest_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--preset",
                "tiny",
                "--in-process",
                "--epochs",
                "3",
                "--no-progress",
                "--opt",
                "hidden=[32]",
                "--run-dir",
                str(run),
                "--checkpoint-every",
                "15",
            ]
        )
        == 0
    )
    _, test = make_synthetic("tiny", seed=0)
    whole = SlideClassifier.load(str(run / "model"))
    assert whole.neighbours_ is not None  # the fused model, built at the end
    n_steps, want = whole.n_steps_, whole.predict_topk(test.X, 5)
    assert n_steps == 3 * 19  # 5% of the rows held out to weigh the fused parts on
    # as if the run had died after its step-30 checkpoint: no model, no later checkpoints
    shutil.rmtree(run / "model")
    checkpoints = run / "checkpoints"
    for later in checkpoints.glob("step-*"):
        if int(later.name.split("-")[1]) > 30:
            shutil.rmtree(later)
    (step30,) = checkpoints.glob("step-00000030-*")
    (checkpoints / "LATEST").write_text(step30.name)
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "resuming at step 30" in out  # steps 31-57 done again
    steps = [r["step"] for r in steps_of(run) if r["kind"] == "step"]
    assert steps == list(range(1, n_steps + 1))  # no step twice, none missing
    clf = SlideClassifier.load(str(run / "model"))
    assert clf.n_steps_ == n_steps
    # the same batches in the same order, the same lr schedule and dropout masks, the
    # same held rows: the resumed model, fused parts and all, is the uninterrupted one
    np.testing.assert_array_equal(clf.predict_topk(test.X, 5), want)


@pytest.mark.slow
def test_more_epochs_carry_a_finished_run_on_at_the_end_of_its_schedule(tmp_path, capsys):
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--preset",
                "tiny",
                "--in-process",
                "--epochs",
                "1",
                "--no-progress",
                "--opt",
                "hidden=[16]",
                "--run-dir",
                str(run),
            ]
        )
        == 0
    )
    assert main(["train", "--resume", str(run), "--epochs", "2", "--no-progress"]) == 0
    capsys.readouterr()
    lrs = [r["lr"] for r in steps_of(run) if r["kind"] == "step"]
    # 19 steps an epoch: 5% of the rows are held out to weigh the fused parts on
    assert len(lrs) == 38 and set(lrs[:19]) == {1e-2}  # one epoch: no decay
    assert set(lrs[19:]) == {0.0}  # past the schedule: lr_floor (raise it to learn on)


@pytest.fixture(scope="module")
def one_epoch_run(tmp_path_factory):
    """A finished in-process run of one epoch (19 steps: 5% of the rows are held out to
    weigh the fused parts on): each test takes a copy."""
    run = tmp_path_factory.mktemp("one-epoch") / "run"
    argv = ["train", "--preset", "tiny", "--in-process", "--no-progress", "--opt", "hidden=[16]"]
    assert main([*argv, "--run-dir", str(run), "--checkpoint-every", "20"]) == 0
    return run


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--lr", "0.1"], "--resume takes the model from the checkpoint"),
        (["--batch-size", "3"], "--batch-size cannot change"),
        (["--epochs", "1"], "already trained 1 of --epochs 1: ask for more --epochs"),
    ],
)
def test_resume_refuses_what_it_cannot_do(one_epoch_run, tmp_path, capsys, extra, message):
    run = tmp_path / "run"
    shutil.copytree(one_epoch_run, run)
    assert main(["train", "--resume", str(run), *extra]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_a_finished_run_resumes_from_its_final_model(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--preset", "tiny", "--in-process", "--no-progress", "--opt", "hidden=[16]"]
    assert main([*argv, "--run-dir", str(run)]) == 0
    assert main(["train", "--resume", str(run), "--epochs", "2", "--no-progress"]) == 0
    assert "resuming at step 19" in capsys.readouterr().out  # 5% held out: 19 an epoch
    steps = [r["step"] for r in steps_of(run) if r["kind"] == "step"]
    assert steps == list(range(1, 39))


def test_resume_without_a_checkpoint_says_so(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("preset: tiny\nin_process: true\nmodel: {}\n")
    assert main(["train", "--resume", str(run), "--epochs", "2"]) == 2
    assert "no checkpoint to resume from" in capsys.readouterr().err


@pytest.mark.slow
def test_report_prints_a_run_and_draws_its_curves(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--preset", "tiny", "--in-process", "--no-progress", "--epochs", "2"]
    argv += ["--opt", "hidden=[16]", "--run-dir", str(run), "--eval-every", "10"]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["report", str(run), "--plot", str(tmp_path / "c.png")]) == 0
    out = capsys.readouterr().out
    assert "run summary" in out and "eval step 30" in out
    assert (tmp_path / "c.png").read_bytes().startswith(PNG)
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "not a run folder" in capsys.readouterr().err


@pytest.mark.slow
def test_an_existing_scheduler_is_used_and_its_workers_awaited(tmp_path, capsys):
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster:
        argv = ["train", "--preset", "tiny", "--scheduler-address", cluster.scheduler_address]
        argv += ["--workers", "2", "--no-progress", "--opt", "hidden=[16]"]
        argv += ["--run-dir", str(tmp_path / "run")]
        assert main(argv) == 0
    out = capsys.readouterr().out
    assert "waiting for 2 workers" in out and "shards          2:" in out


def test_the_run_summary_says_how_the_model_moved():
    from dslide_dask.distributed.moves.policy import Move
    from dslide_dask.model.config import SlideConfig
    from dslide_workflows.summary import summary

    history = [{"step": 1, "samples": 4, "active": 10.0, "bytes_sent": 0, "bytes_received": 0}]
    moves = [
        Move(
            230,
            (),
            ("tcp://c", "tcp://d"),
            4,
            0.55,
            True,
            346_689,
            359_169_804,
            prepare_seconds=6.78,
            steps_while_preparing=30,
        ),
        Move(300, ("tcp://a",), (), 3, 10.9, False, 120_000, 124_000_000),
    ]
    text, numbers = summary(
        history, 1.0, 0.1, (100, 1000), SlideConfig(), [], None, [], moves=moves
    )
    assert (
        "moved           at step 230 onto 4 workers (2 joined), worker to worker: "
        "346,689 rows (359 MB); prepared over 30 steps (6.8 s), training stopped 0.55 s"
    ) in text
    assert "at step 300 onto 3 workers (1 left), through a checkpoint" in text
    assert numbers["moves"][0]["rows_moved"] == 346_689

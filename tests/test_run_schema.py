"""A run's settings have one schema (``dslide_workflows.run_schema``): the flags of
``dslide train`` and ``dslide plan``, the keys of a config file, the checks and what
``--resume`` may change all come from it, so a setting added there is everywhere."""

import argparse
from pathlib import Path

import pytest
import yaml

from dslide_workflows.cli import build_parser
from dslide_workflows.run_schema import (
    RESUMABLE,
    RUN_DEFAULTS,
    SCHEMA,
    RunSettings,
    check_run,
    flag,
)
from dslide_workflows.run_settings import resolve

ROOT = Path(__file__).resolve().parent.parent
#: A setting without a flag of its own, and the flag that gives it.
FLAGGED_ELSEWHERE = {"storage_options": "--storage-option"}


def actions(command: str) -> dict[str, argparse.Action]:
    """``dslide COMMAND``'s flags, by destination."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in sub.choices[command]._actions}


@pytest.mark.parametrize("command", ["train", "plan"])
def test_every_setting_has_its_flag_which_leaves_a_config_file_alone(command):
    flags = actions(command)
    for name in SCHEMA:
        if name in FLAGGED_ELSEWHERE:
            assert FLAGGED_ELSEWHERE[name] in flags[name.removesuffix("s")].option_strings
            continue
        assert flag(name) in flags[name].option_strings, name
        assert flags[name].default is None, name  # not given: the file's value stands


def test_a_config_file_may_hold_every_setting(tmp_path):
    """Every setting's default, written to a config file, reads back as the defaults."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**RUN_DEFAULTS, "preset": "tiny"}))
    run, model = resolve(build_parser().parse_args(["train", "--config", str(path)]))
    assert run == RunSettings(preset="tiny")
    assert model == {"seed": 0}


@pytest.mark.parametrize("name", sorted(SCHEMA))
def test_a_setting_of_the_wrong_kind_is_named_with_its_file(name, tmp_path):
    run = {**RUN_DEFAULTS, name: [1]}  # a list is no setting's kind
    with pytest.raises(ValueError, match=rf"^run\.yaml: {name} must be .*, got \[1\]$"):
        check_run(run, {name: "run.yaml"})
    with pytest.raises(ValueError, match=rf"^{flag(name)} must be "):
        check_run(run, {})


def test_ranges_come_from_the_schema():
    with pytest.raises(ValueError, match=r"--workers must be an integer in \[1, 65536\], got 0"):
        check_run({**RUN_DEFAULTS, "workers": 0}, {})
    with pytest.raises(ValueError, match=r"--wire-dtype must be one of \['float16', 'float32'\]"):
        check_run({**RUN_DEFAULTS, "wire_dtype": "bfloat16"}, {})
    check_run({**RUN_DEFAULTS, "workers": None, "max_decompressed": "2GiB"}, {})


def test_what_a_resumed_run_keeps_is_its_data_batches_seed_and_folder():
    assert set(SCHEMA) - RESUMABLE == {"train", "test", "preset", "batch_size", "seed", "run_dir"}


def test_the_cli_docs_name_where_the_settings_are_defined():
    assert "workflows/run_schema.py" in (ROOT / "docs" / "cli.md").read_text()

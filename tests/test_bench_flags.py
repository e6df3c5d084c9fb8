"""The flags the benchmarks share (``workflows/bench/flags.py``): defined once, each
command's default and words kept, a batch size below 1 refused by every benchmark."""

import argparse

import pytest

from dslide_workflows.bench import (
    accuracy,
    checkpoint,
    cluster,
    ddp,
    distributed,
    elastic,
    engine,
    storage,
)
from dslide_workflows.bench.flags import add_batch_size, add_preset

ABSENT = object()
#: module -> its --preset's and its --batch-size's default (ABSENT: it has no such flag;
#: accuracy's --preset has no default)
DEFAULTS = {
    accuracy: (None, ABSENT),
    checkpoint: ("amazon-3m", ABSENT),
    cluster: ("amazon-670k", 256),
    ddp: (ABSENT, 256),
    distributed: ("amazon-670k", 256),
    elastic: ("amazon-670k", 256),
    engine: ("amazon-670k", 256),
    storage: ("amazon-670k", 256),
}


def parser_of(module) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    module.add_arguments(parser)
    return parser


def action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return next((a for a in parser._actions if flag in a.option_strings), None)


@pytest.mark.parametrize("module", DEFAULTS, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_each_benchmark_keeps_its_defaults(module):
    parser = parser_of(module)
    for flag, default in zip(("--preset", "--batch-size"), DEFAULTS[module], strict=True):
        found = action(parser, flag)
        if default is ABSENT:
            assert found is None
        else:
            assert found is not None and found.default == default
            if default is not None:
                assert found.help is not None and found.help.endswith(f"(default: {default})")


@pytest.mark.parametrize(
    "module",
    [m for m, (_, batch) in DEFAULTS.items() if batch is not ABSENT],
    ids=lambda m: m.__name__.rsplit(".", 1)[-1],
)
@pytest.mark.parametrize("size", ["0", "-3"])
def test_every_batch_size_must_be_positive(module, size):
    action_ = action(parser_of(module), "--batch-size")
    assert action_ is not None
    with pytest.raises(argparse.ArgumentTypeError, match="must be >= 1"):
        action_.type(size)


def test_help_is_the_words_then_the_default():
    parser = argparse.ArgumentParser()
    add_preset(parser, "tiny", about="its shape")
    add_batch_size(parser, 8)
    assert action(parser, "--preset").help == "its shape (default: tiny)"
    assert action(parser, "--batch-size").help == "(default: 8)"
    assert parser.parse_args([]) == argparse.Namespace(preset="tiny", batch_size=8)
    assert parser.parse_args(["--batch-size", "3"]).batch_size == 3
    no_default = argparse.ArgumentParser()
    add_preset(no_default, None, about="a preset instead of --train")
    assert action(no_default, "--preset").help == "a preset instead of --train"

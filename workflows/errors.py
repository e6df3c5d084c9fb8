"""Errors the command line reports in its own way."""


class JobFailed(RuntimeError):
    """A job step failed after reporting why (e.g. a benchmark subprocess): exit 1."""

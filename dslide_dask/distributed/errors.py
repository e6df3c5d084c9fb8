"""Errors of the distributed trainer."""


class ShardLostError(RuntimeError):
    """A worker holding part of the model is gone (its actors died with it)."""

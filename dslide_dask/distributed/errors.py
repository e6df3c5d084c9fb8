"""Errors of the distributed trainer, and how soon a lost worker is noticed."""

#: Seconds between liveness checks while the client, the coordinator or a graph step
#: waits on the model's parts: a worker that dies is noticed within this.
POLL_SECONDS = 2.0


class ShardLostError(RuntimeError):
    """A worker holding part of the model is gone (its actors died with it)."""

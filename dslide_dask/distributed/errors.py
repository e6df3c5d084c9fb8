"""Errors of the distributed trainer, how soon a lost worker is noticed, and the
silencing of Dask's report of calls that died with it."""

import logging
import traceback

from distributed.client import FutureCancelledError

#: Seconds between liveness checks while the client, the coordinator or a graph step
#: waits on the model's parts: a worker that dies is noticed within this.
POLL_SECONDS = 2.0


class _CallsOfReleasedActors(logging.Filter):
    """Drops the traceback tornado logs for an actor call that was waiting on a lost
    worker when the trainer released the actor: distributed's actor proxy then waits
    on the actor's future, which raises ``FutureCancelledError`` inside an event-loop
    callback, where no caller can catch it. The trainer has already said which worker
    was lost and what it did about it; a dump of Dask's internals only alarms."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, FutureCancelledError):
            return True
        frames = traceback.extract_tb(error.__traceback__)
        return not any(
            f.filename.endswith(("distributed/actor.py", "distributed\\actor.py")) for f in frames
        )


def quiet_calls_of_released_actors() -> None:
    """Install :class:`_CallsOfReleasedActors` on tornado's callback logger, once."""
    log = logging.getLogger("tornado.application")
    if not any(isinstance(f, _CallsOfReleasedActors) for f in log.filters):
        log.addFilter(_CallsOfReleasedActors())

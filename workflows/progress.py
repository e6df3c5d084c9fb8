"""Progress of a training run: a bar over steps, step records into the run folder, and
evaluation on the test set every so many steps."""

from __future__ import annotations

import time
from typing import Any

from dslide_workflows.run_schema import RunSettings
from dslide_workflows.summary import format_scores


class Progress:
    """A progress bar over steps, with periodic evaluation on the test set."""

    def __init__(
        self,
        run: RunSettings,
        trainer,
        test,
        quiet: bool,
        log_every: int = 0,
        folder=None,
        total: int | None = None,
    ) -> None:
        self.total = total  #: steps this run will take (the bar's end and its ETA)
        self.folder = folder
        self.log_every = log_every
        self.quiet = quiet
        self.run = run
        self.trainer = trainer
        self.test = test
        self.evaluations: list[dict] = []
        self.bar: Any = None  # a tqdm bar once the first step is taken
        self.samples = 0
        self.t0 = time.perf_counter()

    def __call__(self, stats: dict) -> None:
        bar = self.bar
        if bar is None:  # made at the first step: an early error leaves no bar behind
            from tqdm.auto import tqdm

            bar = self.bar = tqdm(
                total=self.total, unit="step", disable=self.quiet, dynamic_ncols=True
            )
        if self.folder is not None:
            self.folder.add("step", stats)
        self.samples += stats["samples"]
        rate = self.samples / (time.perf_counter() - self.t0)
        bar.update(1)
        bar.set_postfix(loss=f"{stats['loss']:.3f}", samples_s=f"{rate:.0f}", refresh=False)
        if self.log_every and stats["step"] % self.log_every == 0:
            print(
                f"  step {stats['step']:>6}  samples {self.samples:>9}  "
                f"loss {stats['loss']:8.4f}  active/example {stats['active']:8.1f}  "
                f"{rate:8.0f} samples/s",
                flush=True,
            )
        every = self.run.eval_every
        if every and self.test is not None and stats["step"] % every == 0:
            scores = self.trainer.evaluate(
                self.test,
                max_points=self.run.eval_points,
                storage_options=self.run.storage_options,
            )
            self.record_eval(scores)
            bar.write(f"step {stats['step']}: " + format_scores(scores))

    def record_eval(self, scores: dict) -> None:
        """Keep P@k at the current step (once a step)."""
        step = self.trainer.step
        if self.evaluations and self.evaluations[-1]["step"] == step:
            return
        self.evaluations.append({"step": step, **scores})
        if self.folder is not None:
            self.folder.add("eval", {"step": step, **scores})

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def warm_kernels(here: bool = True) -> None:
    """On a first run, compile the kernels before the work, saying what is compiling and
    how far it is (numba caches them on disk: later runs skip this at once). ``here``
    False: the work is on a cluster elsewhere, whose workers have their own caches."""
    from dslide_dask.compiling import warm_up

    if not here:
        return
    t0 = time.perf_counter()

    def show(done: int, total: int, module: str) -> None:
        seconds = time.perf_counter() - t0
        print(f"compiling kernels: {done}/{total} ({module}, {seconds:.0f} s)", flush=True)

    if warm_up(show):
        print(
            f"compiled the kernels in {time.perf_counter() - t0:.0f} s "
            "(a first run only: numba keeps them cached)",
            flush=True,
        )


def performance_report(run: RunSettings, client):
    """Dask's performance report of the run (``--performance-report``), or nothing."""
    import contextlib

    if run.performance_report and client is not None:
        from distributed import performance_report as report

        return report(filename=run.performance_report)
    if run.performance_report:
        raise ValueError("--performance-report needs a Dask cluster (not --in-process)")
    return contextlib.nullcontext()

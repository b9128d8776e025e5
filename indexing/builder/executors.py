"""Who runs a build's unit tasks (unit_work.py): this process, a pool of processes, or Ray (cluster_build.py).

An executor has three calls. `submit(fn, *args, returns=n)` starts `fn(*args)` and gives one handle per
return value (an argument may be a handle of an earlier task: the task gets its value). `gather(handles,
stage)` waits for every one and returns their values in order; after all have ended the first failure is
raised (an `IndexingError` as the task raised it), and with a `stage` name the tasks done are shown
(`UnitProgress`). `close()` ends what the executor started.

`LocalExecutor(1)` runs a task when its value is first asked for, in this process; with more workers, a
pool of processes (spawned: a parent may hold a JVM) runs the units side by side, so one unit's reading and
splitting overlap another's embedding and Lucene indexing.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Executor(Protocol):
    records_nodes: bool  # whether the tasks' nodes are worth a report (several machines)

    def submit(self, fn: Callable[..., Any], *args: Any, returns: int = 1, embeds: bool = False) -> list[Any]: ...

    def gather(self, handles: Sequence[Any], stage: str | None = None) -> list[Any]: ...

    def close(self) -> None: ...


def _progress(iterable: Any, desc: str, unit: str, total: int | None = None) -> Any:
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, unit=unit, total=total, disable=None, mininterval=1.0, leave=False)


class UnitProgress:
    """Work units finished in a stage: a progress bar on a terminal, a log line at most every 15 s."""

    def __init__(self, stage: str, total: int):
        self.stage, self.total, self.count = stage, total, 0
        self.bar = _progress(None, stage, "unit", total=total)
        self.last_log = self.start = time.perf_counter()

    def done(self, status: str = "") -> None:
        self.count += 1
        self.bar.update(1)
        if status:
            self.bar.set_postfix_str(status, refresh=False)
        if time.perf_counter() - self.last_log > 15 and self.count < self.total:
            self.last_log = time.perf_counter()
            log.info("%s: %d/%d units done%s", self.stage, self.count, self.total, f" ({status})" if status else "")

    def close(self) -> None:
        self.bar.close()
        log.info("%s: %d units in %.1fs", self.stage, self.count, time.perf_counter() - self.start)


class _Handle:
    """One return value of a local task: the task's result, or its `index`-th item."""

    def __init__(self, future: Future | _Deferred, index: int | None):
        self.future, self.index = future, index

    def result(self) -> Any:
        value = self.future.result()
        return value if self.index is None else value[self.index]


class _Deferred:
    """A task run in this process when its result is first asked for (once)."""

    def __init__(self, fn: Callable[..., Any], args: tuple):
        self.fn, self.args, self.done, self.value = fn, args, False, None

    def result(self) -> Any:
        if not self.done:
            self.value, self.done = self.fn(*(_value(a) for a in self.args)), True
            self.args = ()
        return self.value


def _value(arg: Any) -> Any:
    return arg.result() if isinstance(arg, _Handle) else arg


class LocalExecutor:
    records_nodes = False

    def __init__(self, workers: int = 1):
        self.pool = None
        if workers > 1:
            self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))

    def submit(self, fn: Callable[..., Any], *args: Any, returns: int = 1, embeds: bool = False) -> list[_Handle]:
        task: Future | _Deferred
        if self.pool is None:
            task = _Deferred(fn, args)
        else:
            task = self.pool.submit(fn, *(_value(a) for a in args))
        return [_Handle(task, i if returns > 1 else None) for i in range(returns)]

    def gather(self, handles: Sequence[_Handle], stage: str | None = None) -> list[Any]:
        progress = UnitProgress(stage, len(handles)) if stage else None
        try:
            if self.pool is None:  # in order; the first failure ends the round (nothing else is running)
                results = []
                for h in handles:
                    results.append(h.result())
                    if progress:
                        progress.done()
                return results
            error: BaseException | None = None
            futures = {id(h.future): h.future for h in handles if isinstance(h.future, Future)}
            for f in as_completed(futures.values()):
                if f.exception() is not None and error is None:
                    error = f.exception()
                if progress:
                    progress.done()
            if error is not None:
                raise error
            return [h.result() for h in handles]
        finally:
            if progress:
                progress.close()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

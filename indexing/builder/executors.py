"""Who runs a build's unit tasks (unit_work.py): this process, a pool of processes, or Ray (cluster_build.py).

An executor has three calls. `submit(fn, *args, returns=n)` starts `fn(*args)` and gives one handle per
return value (an argument may be a handle of an earlier task: the task gets its value). `gather(handles,
stage)` waits for every one and returns their values in order; after all have ended the first failure is
raised (an `IndexingError` as the task raised it), and with a `stage` name the tasks done are shown
(`UnitProgress`). `close()` ends what the executor started.

`LocalExecutor(1)` runs a task when its value is first asked for, in this process; with more workers, a
pool of processes (spawned: a parent may hold a JVM) runs the units side by side, so one unit's reading and
splitting overlap another's embedding and Lucene indexing.

No wait without a limit (issue 78): a build of a large corpus runs for hours, so what is bounded is a wait with
no progress. Progress is a task ending, or a running task's `tick()` (unit_work.py ticks at each embedding step
and each shard, so one long unit is progress too). Waiting for tasks (gather, or a task's argument) with none
for `index.build_stall_s` ends the build with `BuildStalled`, one line naming the tasks awaited, the executor,
and how long; their processes are ended, and nothing is published (publishing follows the last round).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Protocol

from indexing.errors import BuildStalled

log = logging.getLogger(__name__)

LOOK_S = 1.0  # how often a wait for tasks looks at their progress
_tick: Callable[[], None] | None = None  # a task process's progress report (set by its executor), else nothing


def tick() -> None:
    """A running task's step of progress (an embedding step, a shard): a long task is not taken for a hung one."""
    if _tick is not None:
        _tick()


def _count_into(counter: Any) -> None:
    """A pool process's initializer: its ticks add to the executor's shared counter (no lock: a lost increment
    among several still moves it, and a process killed mid-tick cannot leave the driver waiting on a lock)."""
    global _tick

    def bump() -> None:
        counter.value += 1

    _tick = bump
    bump()  # a process started (spawning one and importing may take seconds on a busy machine)


def task_name(fn: Callable[..., Any], args: tuple) -> str:
    """A task as the stall line names it: its function and, for a unit's task, the unit."""
    unit = getattr(args[0], "unit", None) if args else None
    return f"{fn.__name__}({unit})" if unit is not None else fn.__name__


def stalled(tasks: Iterable[str], where: str, waited_s: float, stall_s: float) -> BuildStalled:
    """The build's line for tasks with no progress for `stall_s`: where the driver is, what it awaited, how long."""
    names = sorted(tasks)
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return BuildStalled(
        f"index build (pid {os.getpid()} on {socket.gethostname()}): waited {round(waited_s, 1):g} s for "
        f"{len(names)} task{'s' if len(names) != 1 else ''} {where} ({shown}) with no progress (no task ended, "
        f"none reported a step; index.build_stall_s={stall_s:g}); stopping, nothing published"
    )


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

    def value(self) -> Any:
        """The task's value: run here (in-process), or a pool task's, which the executor has awaited (its bounded
        wait) before anyone asks; an unfinished one raises rather than waits."""
        if isinstance(self.future, _Deferred):
            value = self.future.run()
        else:
            value = self.future.result(timeout=0)
        return value if self.index is None else value[self.index]


class _Deferred:
    """A task run in this process when its result is first asked for (once)."""

    def __init__(self, fn: Callable[..., Any], args: tuple):
        self.fn, self.args, self.done, self.value = fn, args, False, None

    def run(self) -> Any:
        if not self.done:
            self.value, self.done = self.fn(*(_value(a) for a in self.args)), True
            self.args = ()
        return self.value


def _value(arg: Any) -> Any:
    return arg.value() if isinstance(arg, _Handle) else arg


class LocalExecutor:
    """`workers` 1: in this process; more: a pool of spawned processes, whose waits stop after `stall_s` (the
    build's `index.build_stall_s`) with no progress."""

    records_nodes = False

    def __init__(self, workers: int = 1, stall_s: float = 1800.0):
        self.pool: ProcessPoolExecutor | None = None
        self.stall_s = stall_s
        self.names: dict[Future, str] = {}  # a pool task's name, for the stall line
        self.ticks: Any = None  # the pool processes' ticks (shared memory)
        self.where = "in this process"
        if workers > 1:
            ctx = multiprocessing.get_context("spawn")
            self.ticks = ctx.RawValue("Q", 0)
            self.pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_count_into, initargs=(self.ticks,))
            self.where = f"on a pool of {workers} build processes"

    def submit(self, fn: Callable[..., Any], *args: Any, returns: int = 1, embeds: bool = False) -> list[_Handle]:
        task: Future | _Deferred
        if self.pool is None:
            task = _Deferred(fn, args)
        else:
            self._await([a.future for a in args if isinstance(a, _Handle) and isinstance(a.future, Future)])
            task = self.pool.submit(fn, *(_value(a) for a in args))
            self.names[task] = task_name(fn, args)
        return [_Handle(task, i if returns > 1 else None) for i in range(returns)]

    def _await(self, futures: Iterable[Future], each: Callable[[Future], None] | None = None) -> None:
        """Wait until every one of `futures` is done (`each` called as each ends), for as long as the pool makes
        progress; `stall_s` without any ends the build (BuildStalled), its processes ended."""
        futures = list(futures)
        pending = {f for f in futures if not f.done()}
        for f in futures:
            if each and f not in pending:
                each(f)
        last, since = self._progress(), time.monotonic()
        while pending:
            done, pending = cf.wait(pending, timeout=LOOK_S, return_when=cf.FIRST_COMPLETED)
            for f in done:
                if each:
                    each(f)
            now, seen = time.monotonic(), self._progress()
            if done or seen != last:
                last, since = seen, now
            elif now - since > self.stall_s:
                error = stalled((self.names.get(f, "a task") for f in pending), self.where, now - since, self.stall_s)
                self._end_processes()
                raise error

    def _progress(self) -> int:
        return int(self.ticks.value) if self.ticks is not None else 0

    def _end_processes(self) -> None:
        """A stalled pool's processes are killed (a hung task would keep `close` waiting for ever)."""
        pool, self.pool = self.pool, None
        if pool is None:
            return
        for p in list((getattr(pool, "_processes", None) or {}).values()):  # no public way before Python 3.14
            p.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def gather(self, handles: Sequence[_Handle], stage: str | None = None) -> list[Any]:
        progress = UnitProgress(stage, len(handles)) if stage else None
        try:
            if self.pool is None:  # in order; the first failure ends the round (nothing else is running)
                results = []
                for h in handles:
                    results.append(h.value())
                    if progress:
                        progress.done()
                return results
            errors: list[BaseException] = []

            def ended(f: Future) -> None:
                error = f.exception(timeout=0)
                if error is not None:
                    errors.append(error)
                if progress:
                    progress.done()

            futures = {id(h.future): h.future for h in handles if isinstance(h.future, Future)}
            self._await(futures.values(), ended)
            if errors:
                raise errors[0]
            return [h.value() for h in handles]
        finally:
            if progress:
                progress.close()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

"""The driver's commit of a run's batches: parts/ holds each question exactly once, as any Parquet reader counts it.

Writers stage each attempt of a batch under `<out>/_attempts/` (`PartWriter`); the driver, the one committer,
moves the first attempt it hears of per batch key to `_committed/part-<run id>-<batch key>.parquet` and removes
the others (a batch answered twice: an actor drained or lost after writing, before its result came back); the
committed batches are merged into parts/ files of `answer.part_mb` (merge.py). Readers of parts/ never see an
attempt nor a committed batch before its merge. A rerun (`open`) first removes what an earlier run left staged
(every attempt there: the job holds the output, output_lock.py, so no other live job stages any; a dead job's are
never committed), then repairs a folder that holds a question twice (written before this commit existed, or a driver killed
between a commit and the removal of the row it superseded), so that after any end of a job and a rerun the
folder reads each question once. A question whose row is a "system" error row is answered again by a rerun;
once its new row is committed, the old one is removed from its part (`_supersede`). A part is rewritten by question
id (`_rewrite_without`, which reads the part again): the rows of the questions named go, any other row stays, so a
rewrite never drops a question's only row on the strength of positions read earlier.

    with committing(out, run_id) as committer:
        done = committer.open()                     # the ids a rerun skips
        for report in committer.each(runner):       # each report names its staged attempt; now its part
            ...
    committer.summary()                             # close() removed this run's attempts left staged

The summary is folded as batches commit (tally.py: each report carries its batch's sums), onto the tally of the
parts found at the start: the one the previous run left (`_tally.json`, covering the parts it names) plus the
parts it does not name; a folder repaired at the start, a tally gone or naming a part that is gone, is counted
again from its rows. The file is removed at the start and written at the close, so a run killed after
rewriting a part leaves none, and the next run counts again. So the end of a run reads no part.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from pipeline.io.id_set import IdSet
from pipeline.io.merge import PartMerger
from pipeline.io.output import _fs, _is_local, keep_one, part_files, read_json, read_parts, write_json, write_table
from pipeline.io.output_lock import OutputBusyError, check_held, held_throughout
from pipeline.io.part_store import ATTEMPTS, attempt_key, with_retries
from pipeline.io.tally import Tally

log = logging.getLogger(__name__)

_KEY = ["question_id", "finished_at", "error", "error_kind"]
TALLY_FILE = "_tally.json"  # the summary's sums over the parts it names (a leading _: no reader of rows looks)


class Committer:
    def __init__(self, out: str, run_id: str, part_mb: float = 128.0):
        self.out, self.run_id = out, run_id
        self.fs, self.base = _fs(out)
        self.merger = PartMerger(self.fs, self.base, run_id, part_mb)
        self.parts: list[str] = []  # what the run's summary reads: the parts at its start and those it committed
        self.committed: dict[str, str] = {}  # batch key -> its part
        self._system_errors: dict[str, str] = {}  # question id -> the part holding its "system" error row
        self._emptied: set[str] = set()  # parts removed, every row of theirs superseded
        self.tally: Tally | None = None  # the summary's sums over self.parts (None: count again from the rows)
        self._rows_read: list[int] = []  # rows of each part the last deduplication read

    # -- the start ----------------------------------------------------------------------------------
    def open(self) -> IdSet:
        """Remove every staged attempt (an earlier run's, never committed), repair the parts so that each question
        has one row, and return the ids a rerun skips: every row but a "system" error row (or an error row of a
        part older than error_kind), which is answered again."""
        self._remove_attempts("")
        saved = read_json(self.out, TALLY_FILE)
        if saved is not None:
            self.fs.rm(f"{self.base}/{TALLY_FILE}")  # written again at the close (module docstring)
        listed = part_files(self.out)
        listed += self.merger.recover(listed)  # an earlier run's batches committed and not merged
        kept = self._deduplicate(listed)
        self.parts = [p for p in listed if p not in self._emptied]
        self.tally = self._tally_at_start(saved, repaired=kept.num_rows < sum(self._rows_read))
        import pyarrow.compute as pc

        answered = pc.fill_null(pc.or_kleene(pc.is_null(kept["error"]), pc.equal(kept["error_kind"], "input")), False)
        retried = kept.filter(pc.invert(answered)).select(["question_id", "_part"]).to_pydict()
        for q, part in zip(retried["question_id"], retried["_part"]):
            self._system_errors[q] = listed[part]
        return IdSet(kept.filter(answered)["question_id"])  # compact: 10^6 ids are not 10^6 objects

    def _deduplicate(self, parts: list[str]) -> pa.Table:
        """Keep one row a question over `parts` (`keep_one`): rewrite each part holding a row another part's row
        of its question supersedes, without it. Returns the rows kept (key columns, `_part`: index in `parts`)."""
        tables = [_numbered(read_parts(self.out, _KEY, [p]), i) for i, p in enumerate(parts)]
        self._rows_read = [t.num_rows for t in tables]
        rows = (
            pa.concat_tables(tables, promote_options="default")
            if tables
            else _numbered(read_parts(self.out, _KEY, []), 0)
        )
        kept = keep_one(rows)
        if kept.num_rows == rows.num_rows:
            return kept
        keep = set(zip(kept["_part"].to_pylist(), kept["_row"].to_pylist()))
        where = {  # each question's kept row: its part, and what names it there (when it finished, its error)
            q: (p, (at, error))
            for q, p, at, error in zip(*(kept[c].to_pylist() for c in ("question_id", "_part", "finished_at", "error")))
        }
        drop: dict[int, set[str]] = {}
        for q, p, r in zip(rows["question_id"].to_pylist(), rows["_part"].to_pylist(), rows["_row"].to_pylist()):
            if (p, r) not in keep:
                drop.setdefault(p, set()).add(q)
        for p, ids in drop.items():  # by id: a question's row kept in this part stays
            self._rewrite_without(parts[p], ids, {q: where[q][1] for q in ids if where[q][0] == p})
        log.warning("repaired %s: %d rows of questions written twice removed", self.out, rows.num_rows - kept.num_rows)
        return kept

    def _tally_at_start(self, saved: dict | None, repaired: bool) -> Tally:
        """The sums over the parts found at the start (module docstring)."""
        named = {p.rsplit("/", 1)[-1] for p in self.parts}
        covered = set(saved["parts"]) if saved else set()
        if saved is None or repaired or not covered <= named:
            return self._recount()
        tally = Tally.from_json(saved["tally"])
        rest = [p for p in self.parts if p.rsplit("/", 1)[-1] not in covered]  # committed by a run killed since
        return tally.add(Tally.of_table(read_parts(self.out, None, rest))) if rest else tally

    def summary(self) -> dict[str, Any]:
        """The summary's figures over the output's parts (tally.py), without reading them where the tally holds."""
        return (self.tally or self._recount()).summary()

    def _recount(self) -> Tally:
        return Tally.of_table(keep_one(read_parts(self.out, None, self.parts)))

    # -- each batch ---------------------------------------------------------------------------------
    def commit(self, report: dict[str, Any]) -> dict[str, Any] | None:
        """Commit the staged attempt a batch's report names (its "part" becomes the committed part); None for an
        attempt of a batch already committed (removed: its rows are on disk once already)."""
        attempt = report.get("part")
        if not attempt:
            return report
        check_held(self.out)  # an output whose lease this job lost (output_lock.py) is another job's now
        key = attempt_key(attempt)
        if key in self.committed:
            self._remove(attempt)
            return None
        part = self.merger.stage_path(key)
        self._move(attempt, part)
        self.committed[key] = part
        self.parts.append(part)
        if self.tally is not None:  # (every report of rows carries its sums: batch_report)
            self.tally.add(Tally.from_json(report["tally"]))
        if self._system_errors:
            self._supersede(part)
        if self.merger.add(part):
            self._merge()
        return {**report, "part": part}

    def _merge(self) -> None:
        """The committed batches merged into the run's growing part (merge.py); the run's files renamed so."""
        merged = self.merger.merge()
        if merged is None:
            return
        inputs, target = merged
        gone = set(inputs)
        self.parts = [p for p in self.parts if p not in gone] + [target]
        self._system_errors = {q: target if p in gone else p for q, p in self._system_errors.items()}

    def each(self, reports: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """`reports` committed one by one (`commit`), those of a batch already committed left out. Each is
        committed before the next is asked of `reports`, so a runner resuming after its yield knows it is."""
        for staged in reports:
            try:
                report = self.commit(staged)
            except BaseException:
                self.tally = None  # stopped part way through a commit: the summary counts the rows again
                raise
            if report is not None:
                yield report

    def _supersede(self, part: str) -> None:
        """Remove the older "system" error rows of the questions `part` answers again."""
        ids = read_parts(self.out, ["question_id"], [part])["question_id"].to_pylist()
        by_part: dict[str, set[str]] = {}
        for q in ids:
            if q in self._system_errors:
                by_part.setdefault(self._system_errors.pop(q), set()).add(q)
        for old, qs in by_part.items():
            errors = self._rewrite_without(old, qs)
            if self.tally is not None:
                self.tally.remove_error_rows([e for e in errors if e is not None])  # (each a "system" error row)

    def _rewrite_without(self, part: str, ids: set[str], keep: dict[str, tuple] | None = None) -> list[str | None]:
        """Rewrite `part`, read again now, without the rows of the questions `ids`, but for the one row of a question
        in `keep` whose (finished_at, error) it names (the row kept of a question written twice in this part); rows of
        other questions stay whatever their position. Removed when no row is left; atomic per file. Returns the
        "error" of each row removed."""
        table = read_parts(self.out, None, [part])
        keep = dict(keep or {})
        mask, errors = [], []
        for q, at, error in zip(*(table[c].to_pylist() for c in ("question_id", "finished_at", "error"))):
            kept = q not in ids or (q in keep and keep[q] == (at, error))
            if kept and q in keep:
                del keep[q]  # one row a question
            mask.append(kept)
            if not kept:
                errors.append(error)
        rest = table.filter(pa.array(mask, pa.bool_()))
        if rest.num_rows:
            write_table(self.fs, part, rest)  # (a merged part keeps its footer: the batches it holds)
        else:
            self._remove(part)
            self._emptied.add(part)
            self.parts = [p for p in self.parts if p != part]
            self.merger.drop(part)
        return errors

    # -- the end ------------------------------------------------------------------------------------
    def close(self, failing: bool = False) -> None:
        """Commit this run's attempts of batches the driver never heard of (`_adopt_attempts`), then remove its
        attempts still staged (a batch drained part way on a node that went, then answered whole elsewhere). A
        zombie's attempt written after this stays staged until the next run's `open`. On an
        object store the parts are deduplicated again unless the job held its lease throughout (output_lock.py
        keeps other jobs out, but a job whose lease went unrenewed for its time to live may have shared the output
        for a while): so the close of a job that held it reads no part it did not write. A job whose
        lease another job holds now does neither this nor the tally: the output is the other's."""
        self._adopt_attempts()
        self._remove_attempts(f"{self.run_id}-")
        unmerged = None
        try:
            self._merge()  # the last committed batches: the run's last part
        except Exception as exc:  # left committed: the next run merges them (merge.py)
            unmerged, self.tally = exc, None
        try:
            check_held(self.out)
        except OutputBusyError as lost:  # another job holds the output now: its parts and tally are its own
            log.warning("%s", lost)
            self.tally = None
            if unmerged is not None and not failing:
                raise unmerged from None
            return
        if not _is_local(self.fs) and not held_throughout(self.out):  # (held: no other job wrote here meanwhile)
            try:
                self.fs.invalidate_cache()
                listed = list(dict.fromkeys([*self.parts, *part_files(self.out)]))
                if self._deduplicate(listed).num_rows < sum(self._rows_read) or len(listed) > len(self.parts):
                    self.tally = None  # another job's rows or repairs: the summary counts the rows again
                    self.parts = [p for p in listed if p not in self._emptied]
            except Exception as exc:  # the rerun's open repairs what this could not
                log.warning("could not deduplicate %s (%s: %s); a rerun does", self.out, type(exc).__name__, exc)
                self.tally = None
        if self.tally is not None and self.parts:  # (a job that wrote no row leaves no file)
            parts = [p.rsplit("/", 1)[-1] for p in self.parts]
            try:
                write_json(self.out, TALLY_FILE, {"parts": parts, "tally": self.tally.to_json()})
            except Exception as exc:  # the next run counts the rows again; the job's own end stands
                log.warning("could not save the tally of %s (%s: %s)", self.out, type(exc).__name__, exc)
        if unmerged is not None:  # committed, not yet where readers look: the job's error, unless it has one
            if not failing:
                raise unmerged
            log.debug("the last batches of %s stay committed, not merged: %s", self.out, unmerged)

    # -- storage ------------------------------------------------------------------------------------
    def _move(self, src: str, dst: str) -> None:
        if _is_local(self.fs):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.replace(src, dst)  # atomic: the part appears whole
            return
        with_retries(f"committing {dst}", lambda: self.fs.copy(src, dst))  # one object, whole (S3 CopyObject)
        self._remove(src)

    def _remove(self, path: str) -> None:
        try:
            with_retries(f"removing {path}", lambda: self.fs.rm(path))
        except FileNotFoundError:
            pass
        except Exception as exc:  # an attempt left staged is never read; the next run's open removes it
            log.warning("could not remove %s (%s: %s)", path, type(exc).__name__, exc)

    def _adopt_attempts(self) -> None:
        """Commit this run's attempts of batches it has not committed: written whole by an engine actor that
        drained (for its node, or the driver's SIGTERM) after the driver stopped reading reports, they hold
        finished answers. One a batch, the one with the most rows (a batch drained part way, then answered whole
        elsewhere); batches hold different questions (a batch key is a digest of its ids), so each question
        stays once. An attempt that cannot be read or committed is left to the removal (a rerun answers it)."""
        fullest: dict[str, dict[str, Any]] = {}  # batch key -> the report its attempt would have had
        for path in self._staged(f"{self.run_id}-"):
            key = attempt_key(path)
            if path.rsplit("/", 1)[-1].startswith(".") or key in self.committed:
                continue
            try:
                table = read_parts(self.out, None, [path])
            except Exception as exc:
                log.warning("could not read %s (%s: %s)", path, type(exc).__name__, exc)
                continue
            if table.num_rows > fullest.get(key, {"rows": -1})["rows"]:
                fullest[key] = {"part": path, "rows": table.num_rows, "tally": Tally.of_table(table).to_json()}
        for _, report in sorted(fullest.items()):
            try:
                self.commit(report)
            except Exception as exc:
                log.warning("could not commit %s (%s: %s)", report["part"], type(exc).__name__, exc)
                return
        if fullest:
            log.info("%d batches written after the driver stopped reading (a drain) committed", len(fullest))

    def _staged(self, prefix: str) -> list[str]:
        """`_attempts/`'s files of `prefix` (attempts, and a writer's temporary file of one whose node went)."""
        folder = f"{self.base}/{ATTEMPTS}"
        try:
            self.fs.invalidate_cache(folder)
            found = self.fs.ls(folder, detail=False) if self.fs.exists(folder) else []
        except FileNotFoundError:
            return []
        return [p for p in found if p.rsplit("/", 1)[-1].lstrip(".").startswith(prefix)]

    def _remove_attempts(self, prefix: str) -> None:
        for path in self._staged(prefix):  # an attempt, or a temporary file of one (`.<attempt>.<hex>.tmp`)
            self._remove(path)


def _numbered(table: pa.Table, part: int) -> pa.Table:
    """`table` with each row's part (its index in the parts listed) and its position in that part."""
    n = table.num_rows
    return table.append_column("_part", pa.array([part] * n, pa.int32())).append_column(
        "_row", pa.array(range(n), pa.int32())
    )


@contextlib.contextmanager
def committing(out: str, run_id: str) -> Iterator[Committer]:
    """A Committer of `out`, closed on the way out whatever the end (success, an error, an interrupt)."""
    committer = Committer(out, run_id)
    try:
        yield committer
    finally:
        committer.close()

"""What the drop-in does after the engine ran: integrity data, checksum verification,
monitoring records, statistics -- the parts of pegasus-transfer's contract that Pegasus
reads back (see the spec, sections 1.8 and 1.9).

* ``generate_checksum``: once per LFN, the kickstart "fullstat" YAML of the local end
  (source if it is a local file, else destination) is appended to
  ``$KICKSTART_INTEGRITY_DATA``.
* ``verify_checksum_remote``: the destination (pulled back to a temp file when remote) is
  checked against ``./*.meta``; a mismatch re-runs the transfer, up to the attempt limit,
  and one ``@@@MONITORING_PAYLOAD`` line per linkage reports the counts of checks, as stock
  does (every attempt's). A destination that still fails is removed, a remote object too
  (stock leaves it in place).
* With ``$PEGASUS_MULTIPART_DIR`` set, every attempt is written as ``transfer_attempts``.
"""

from __future__ import annotations

import os
import time

from pegasus_cloudio.dropin import monitoring, stats
from pegasus_cloudio.dropin.log import log
from transfer.lean import record, replace
from transfer.ops import Result, Transfer

# integrity (kickstart's fullstat YAML, .meta files) is imported only by jobs that ask for it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

    from pegasus_cloudio.dropin import integrity
    from pegasus_cloudio.dropin.spec import Entry
    from transfer import Engine
    from transfer.ops import Attempt
    from transfer.urls import Url

__all__ = ["Outcome", "Result", "finish", "stats_lines"]


@record
class Outcome:
    records: List[monitoring.AttemptRecord]
    failed: int


def finish(entries: Sequence[Entry], results: List[Result], engine: Engine, env: Mapping[str, str]) -> Outcome:
    results = list(results)
    _generate_checksums(entries, results, env)
    _verify_remote(entries, results, engine)
    records = [record for entry, result in zip(entries, results) if isinstance(result.op, Transfer)
               for record in _records(entry, result)]
    if env.get("PEGASUS_MULTIPART_DIR"):
        monitoring.write_transfer_attempts(env["PEGASUS_MULTIPART_DIR"], records)
    return Outcome(records, sum(not r.ok for r in results))


def stats_lines(records: Sequence[monitoring.AttemptRecord], started: float) -> List[str]:
    """The stock summary; its seconds are the whole run's wall time, as in 5.1.3."""
    return stats.format_stats(records, total_seconds=time.time() - started)


def _records(entry: Entry, result: Result) -> List[monitoring.AttemptRecord]:
    """One record per attempt of a transfer, with the bytes stock's ``Stats.add_stats`` records:
    the size of the attempt's local end (the source if it is a file:// URL, else the destination)
    when the attempt ended. Our writes are atomic, so a failed attempt left the destination as the
    last successful attempt made it or, before any, as it was before the transfer: as it is now
    when no attempt succeeded, else taken as absent (Pegasus stages into fresh destinations), as
    stock finds it after a failed download (s3transfer's temp file is gone, nothing renamed)."""
    records = []
    left: Optional[int] = 0 if any(a.ok for a in result.history) else None  # None: as it is now
    for attempt in result.history:
        source = attempt.source
        local = source.path if source and source.scheme == "file" else \
            attempt.dest.path if attempt.dest.scheme == "file" else None
        into_local = local is not None and local == attempt.dest.path
        if local is None:
            size = 0
        elif into_local and not attempt.ok and left is not None:
            size = left
        else:
            size = _local_size(local, attempt)
            left = size if into_local and attempt.ok else left
        records.append(monitoring.AttemptRecord(
            src_url=str(source) if source else "", src_label=source.site_label if source else None,
            dst_url=str(attempt.dest), dst_label=attempt.dest.site_label, success=attempt.ok,
            start=attempt.start, duration=attempt.seconds, lfn=entry.lfn,
            bytes=size, local_file=local is not None))
    return records


def _local_size(path: str, attempt: Attempt) -> int:
    """``path``'s size now (a successful copy: its byte count, no stat needed), 0 when absent."""
    if attempt.ok and attempt.bytes > 0:
        return attempt.bytes
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _generate_checksums(entries: Sequence[Entry], results: List[Result], env: Mapping[str, str]) -> None:
    done: Set[str] = set()
    for entry, result in zip(entries, results):
        if not (entry.generate_checksum and result.ok and entry.lfn) or entry.lfn in done:
            continue
        path = _local_end(result)
        if path is None:
            continue
        done.add(entry.lfn)
        from pegasus_cloudio.dropin import integrity
        try:
            integrity.append_integrity_data(
                integrity.fullstat_yaml(entry.lfn, path, output=True), env)
        except OSError as err:
            log.error("Unable to generate checksum for %s: %s", entry.lfn, err)


def _local_end(result: Result) -> Optional[str]:
    op = result.op
    assert isinstance(op, Transfer)
    if result.source is not None and result.source.scheme == "file":
        return result.source.path
    if op.dest.is_local:
        return op.dest.path
    return None


def _verify_remote(entries: Sequence[Entry], results: List[Result], engine: Engine) -> None:
    wanted = [i for i, (e, r) in enumerate(zip(entries, results)) if e.verify_checksum_remote and r.ok and e.lfn]
    if not wanted:
        return
    from pegasus_cloudio.dropin import integrity
    index = integrity.load_meta_index(".")
    counts: Dict[str, Tuple[int, int, float]] = {}  # linkage -> checks passed, checks failed, seconds
    for position in wanted:
        entry = entries[position]
        good, bad, seconds = _verify_with_retries(entry, engine, results, position, index)
        file_type = entry.linkage or "unknown"  # stock's add_integrity_verify: one key for None and ""
        before = counts.get(file_type, (0, 0, 0.0))
        counts[file_type] = (before[0] + good, before[1] + bad, before[2] + seconds)
    for file_type, (good, bad, total) in counts.items():
        log.info("%s", monitoring.integrity_payload_line(file_type, good, bad, total))


def _verify_with_retries(entry: Entry, engine: Engine, results: List[Result], index: int,
                         meta: "integrity.MetaIndex") -> Tuple[int, int, float]:
    """Verify, re-running the transfer after a failed check while attempts are left; returns
    (checks passed, checks failed, seconds). Every check counts, as in stock, whose
    ``add_integrity_verify`` runs once per attempt: three failed attempts are ``failed: 3``."""
    op = entry.op
    assert isinstance(op, Transfer) and entry.lfn
    spent = 0.0
    failed = 0
    attempts = results[index].attempts
    while True:
        outcome = _verify_once(entry, engine, meta)
        spent += outcome.seconds
        if outcome.ok:
            return 1, failed, spent
        failed += 1
        log.error("Integrity check failed for %s: %s", entry.lfn, outcome.message)
        if attempts >= engine.max_attempts:
            results[index] = Result(op, False, 0, results[index].seconds, attempts,
                                    results[index].error, None, results[index].history)
            _discard(results[index].source or op.sources[0], op, engine)
            return 0, failed, spent
        source = results[index].source or op.sources[0]
        rerun = engine.run([op])[0]
        attempts += rerun.attempts
        # every attempt stays in the record (transfer_attempts), the first run's included
        results[index] = replace(rerun, history=results[index].history + rerun.history)
        if not rerun.ok:
            _discard(source, op, engine)  # the copy that failed its check is still there
            return 0, failed, spent


def _discard(source: "Url", op: Transfer, engine: Engine) -> None:
    """Remove a destination that failed its integrity check, so that no job reads it under its
    name: a local file, or a remote object (stock leaves the object, which a later job or a
    rescue run would read without a word); never the source itself (a destination naming the
    source's file or object)."""
    if not op.dest.is_local:
        if op.dest.full != source.full:
            _discard_remote(op.dest, engine)
        return
    if op.dest.scheme not in ("file", "symlink"):
        return
    dest = op.dest.path
    named = os.path.join(os.path.realpath(os.path.dirname(dest) or "."), os.path.basename(dest))
    if source.is_local and named == os.path.realpath(source.path):
        return
    try:
        os.unlink(dest)
    except FileNotFoundError:
        pass
    except OSError as err:
        log.error("Unable to remove %s after its failed integrity check: %s", dest, err)


def _discard_remote(dest: "Url", engine: Engine) -> None:
    from transfer.ops import Remove
    with engine.uncached() as store:
        removed = store.run([Remove(dest)])[0]
    if removed.ok:
        log.warning("Removed %s: it failed its integrity check", dest)
    else:
        log.error("Unable to remove %s after its failed integrity check: %s", dest, removed.error)


def _verify_once(entry: Entry, engine: Engine, meta: "integrity.MetaIndex") -> "integrity.VerifyOutcome":
    import tempfile

    from pegasus_cloudio.dropin import integrity
    from transfer.urls import parse_url
    op = entry.op
    assert isinstance(op, Transfer) and entry.lfn
    if op.dest.is_local:
        return integrity.verify_against_meta(entry.lfn, op.dest.path, index=meta)
    log.info("Pulling back %s to verify checksum", entry.lfn)
    fd, temp = tempfile.mkstemp(prefix="pegasus-cloudio-verify-")
    os.close(fd)
    started = time.monotonic()
    try:
        with engine.uncached() as store:  # the store's copy, never the cache's (the upload itself)
            pulled = store.run([Transfer((op.dest,), parse_url(temp))])[0]
        if not pulled.ok:
            return integrity.VerifyOutcome(False, f"pull-back failed: {pulled.error}",
                                           time.monotonic() - started)
        return integrity.verify_against_meta(entry.lfn, temp, index=meta)
    finally:
        os.unlink(temp)

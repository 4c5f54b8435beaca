"""One result ad per file, written the moment the file's outcome is known.

:class:`Reporter` turns an engine :class:`~transfer.ops.Result` (or a problem found before
any transfer) into the attributes the starter reads (HTCondor's result filter keeps only
these names with exactly these types):

``TransferUrl`` s (the input ``Url`` verbatim), ``TransferFileName`` s (the input
``LocalFileName``), ``TransferType`` s, ``TransferProtocol`` s, ``TransferSuccess`` b,
``TransferTotalBytes`` i, ``TransferFileBytes`` i, ``TransferStartTime`` i,
``TransferEndTime`` i, ``ConnectionTimeSeconds`` r (files that were attempted),
``DeveloperData`` ad, and on failure ``TransferError`` s and ``TransferErrorData`` list.

Failures are bounded, because the starter joins the ``TransferError`` of every failed ad
into one hold reason and passes it through a pipe it reads in one call: 200 joined texts of
300 characters (about 90 KB with HTCondor's own prefixes) broke that read on 23.9 and the
job was restarted instead of held, again and again. So a ``TransferError`` is at most
:data:`MAX_ERROR_CHARS` characters (``TransferErrorData`` at most :data:`MAX_ERROR_ENTRIES`
entries of :data:`MAX_ERROR_STRING` characters), success ads are written as files finish,
and failed ads are written by :meth:`Reporter.finish`: at most :data:`MAX_FAILED_ADS`, in
reverse request order, the first failed file last. HTCondor lists the error of the last ad
first, so the hold reason begins with the first failed URL and the count of failures, and
ends with :data:`TRANSIENT_MARK` when every failure was transient (exit 11). Every
failure, in full, is one line of the plugin's output (the StarterLog keeps its last 16 KiB).

``compact`` (for a starter older than 24.4, see :mod:`.starter`): such a starter reads one pipe
message after a failed transfer, and each ad is one message, so on failure the file is
rewritten to hold exactly one ad, the first failed file's, with the count of failures. The
success ads written meanwhile (kept if the plugin is killed) are dropped from the file, and
with them those files' records in the transfer history of an attempt that failed anyway.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple
from urllib.parse import urlsplit

from pegasus_cloudio.condor import PLUGIN_VERSION, outcome
from pegasus_cloudio.condor.ads import ResultWriter
from pegasus_cloudio.condor.batch import Item
from pegasus_cloudio.condor.credentials import describe_source, is_presigned
from pegasus_cloudio.condor.environment import PluginEnvironment
from transfer import schemes
from transfer.credentials import pegasus_s3_config
from transfer.errors import TransferError
from transfer.ops import Attempt, Result
from transfer.session import Session
from transfer.urls import Url


MAX_FAILED_ADS = 10
MAX_ERROR_CHARS = 500
MAX_ERROR_ENTRIES = 4
MAX_ERROR_STRING = 200
# Ends the first failed ad's TransferError when the plugin exits 11 (every failure transient):
# a 23.9 starter holds a failed output transfer with HoldReasonSubCode 1 whatever the plugin's
# exit code, so docs/condor.md's release policy finds these holds by this text in HoldReason.
TRANSIENT_MARK = "[pegasus-cloudio: transient, exit 11]"

Fields = Dict[str, object]


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with "..."."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


class Reporter:
    """Writes result ads for ``items`` and remembers every failure (for the exit code)."""

    def __init__(self, writer: ResultWriter, items: Sequence[Item], *, upload: bool, penv: PluginEnvironment,
                 say: Callable[[str], None], compact: bool = False) -> None:
        self._writer = writer
        self._compact = compact
        self._items = list(items)
        self._by_op = {id(item.op): item for item in items if item.op is not None}
        self._reported: Set[int] = set()
        self._upload = upload
        self._penv = penv
        self._say = say
        self.session: Optional[Session] = None
        self.errors: List[TransferError] = []
        self._failed: List[Tuple[int, Fields]] = []
        self._index = {id(item): number for number, item in enumerate(self._items)}
        self.write_failed = False
        self.writing = False
        self.pending_signal: Optional[int] = None
        self.on_signal: Callable[[int], None] = _ignore_signal

    # -- entry points -------------------------------------------------------------------

    @property
    def total(self) -> int:
        """How many files the batch has."""
        return len(self._items)

    def on_result(self, result: Result) -> None:
        """Engine callback: the ad of the file ``result`` belongs to. A signal arriving meanwhile
        waits until the file is recorded (``writing``), then goes to ``on_signal``."""
        item = self._by_op[id(result.op)]
        self.writing = True
        try:
            if result.ok:
                self._write(item, self._success(item, result))
            else:
                assert result.error is not None
                self._failure(item, result.error, result.history, result.attempts, result.seconds)
        finally:
            self.writing = False
        if self.pending_signal is not None:
            signum, self.pending_signal = self.pending_signal, None
            self.on_signal(signum)

    def problem(self, item: Item) -> None:
        """The ad of a file that was never attempted (malformed ad, unserved scheme...)."""
        assert item.problem is not None
        self._failure(item, item.problem, (), 0, None)

    def fail_unreported(self, error: Callable[[Item], TransferError]) -> None:
        """Failed ads for every file without an ad yet (interrupted or crashed batch)."""
        for item in self._items:
            if id(item) not in self._reported:
                self._failure(item, error(item), (), 0, None)

    # -- ads ----------------------------------------------------------------------------

    def _base(self, item: Item) -> Dict[str, object]:
        return {"TransferUrl": item.ad.url, "TransferFileName": item.ad.local,
                "TransferType": "upload" if self._upload else "download",
                "TransferProtocol": item.protocol}

    def _success(self, item: Item, result: Result) -> Dict[str, object]:
        start, end = _times(result.history)
        fields = self._base(item)
        fields.update(TransferSuccess=True, TransferTotalBytes=int(result.bytes), TransferFileBytes=int(result.bytes),
                      TransferStartTime=start, TransferEndTime=end, ConnectionTimeSeconds=float(result.seconds),
                      DeveloperData={"PluginVersion": PLUGIN_VERSION, "Attempts": result.attempts})
        return fields

    def _failure(self, item: Item, error: TransferError, history: Sequence[Attempt], attempts: int,
                 seconds: Optional[float]) -> None:
        self.errors.append(error)
        start, end = _times(history)
        local = item.local_path
        source = self._source(item)
        text = outcome.scrub(outcome.error_text(error, upload=self._upload, url=item.ad.url, local=item.ad.local,
                                                attempts=attempts, source=source), item.ad.url)
        server = self._server(item.url)
        entries = [outcome.error_entry(e, server, local, item.credential is not None)
                   for e in outcome.attempt_errors(history, error)]
        if len(entries) > MAX_ERROR_ENTRIES:
            entries = entries[:1] + entries[1 - MAX_ERROR_ENTRIES:]
        for entry in entries:
            entry["ErrorString"] = shorten(outcome.scrub(str(entry["ErrorString"]), item.ad.url), MAX_ERROR_STRING)
        fields = self._base(item)
        fields.update(TransferSuccess=False, TransferError=shorten(text, MAX_ERROR_CHARS), TransferErrorData=entries,
                      TransferTotalBytes=0, TransferFileBytes=0, TransferStartTime=start, TransferEndTime=end,
                      DeveloperData={"PluginVersion": PLUGIN_VERSION, "Attempts": attempts})
        if seconds is not None:
            fields["ConnectionTimeSeconds"] = float(seconds)
        self._say(text)
        self._reported.add(id(item))
        self._failed.append((self._index[id(item)], fields))

    def finish(self) -> None:
        """Write the failed ads (see the module docstring); call once, after the batch."""
        failed = [fields for _, fields in sorted(self._failed, key=lambda pair: pair[0])]
        self._failed = []
        if not failed:
            return
        shown = failed[:1] if self._compact else failed[:MAX_FAILED_ADS]
        first = shown[0]
        if len(failed) > 1:
            first["TransferError"] = (f"{first['TransferError']} [the first of {len(failed)} failed files, out of "
                                      f"{len(self._items)}; every failure is listed in the plugin's output]")
        if outcome.exit_code(self.errors) == outcome.EXIT_TRANSIENT:
            first["TransferError"] = f"{first['TransferError']} {TRANSIENT_MARK}"
        if self._compact:
            self._write_fields(shown[0], replace=True)
            return
        for fields in reversed(shown):
            self._write_fields(fields)

    def _write(self, item: Item, fields: Fields) -> None:
        self._reported.add(id(item))
        self._write_fields(fields)

    def _write_fields(self, fields: Fields, replace: bool = False) -> None:
        if self.write_failed:
            return
        try:
            if replace:
                self._writer.rewrite(fields)
            else:
                self._writer.write(fields)
        except OSError as err:
            self.write_failed = True
            self._say(f"cannot write the result file {self._writer.path}: {err.strerror or err}")

    def close(self) -> None:
        """Close the result file (for a plugin leaving on a signal; else its owner closes it)."""
        self._writer.close()

    # -- context for messages -----------------------------------------------------------

    def _source(self, item: Item) -> str:
        if item.url is None:
            return "none"
        return describe_source(item.url, item.credential, self._penv, is_presigned(item.ad.url))

    def _server(self, url: Optional[Url]) -> str:
        """The server a URL's requests went to (``FailedServer``), as ``host[:port]``."""
        if url is None:
            return "unknown"
        env = self._penv.env
        if url.scheme in schemes.S3 and "@" in url.host and self.session is not None:
            try:
                creds = self.session.context.pegasus_credentials(url.site_label)
                site_endpoint = pegasus_s3_config(creds, url.host).endpoint or ""
                return urlsplit(site_endpoint).netloc or url.host
            except TransferError:
                return url.host.rpartition("@")[2]
        if url.scheme in schemes.S3:
            endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
            return urlsplit(endpoint).netloc if endpoint else f"{url.host}.s3.amazonaws.com"
        if url.scheme == "gs":
            return env.get("STORAGE_EMULATOR_HOST") or "storage.googleapis.com"
        return url.host


def _times(history: Sequence[Attempt]) -> Tuple[int, int]:
    """(start, end) in whole epoch seconds, from the attempts (now, if there were none)."""
    if not history:
        now = int(time.time())
        return now, now
    last = history[-1]
    return int(history[0].start), int(last.start + last.seconds)


def _ignore_signal(signum: int) -> None:
    return None


def say(text: str) -> None:
    """One diagnostic line on stderr (the starter logs it to the StarterLog on failure)."""
    sys.stderr.write(f"pegasus-cloudio-condor-plugin: {text}\n")
    sys.stderr.flush()

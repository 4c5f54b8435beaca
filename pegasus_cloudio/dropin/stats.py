"""The human-readable ``Stats:`` summary stock pegasus-transfer 5.1.3 logs at the end.

Nothing in Pegasus parses these lines (spec 1.8); they are kept for users who grep for
them. The computation follows ``Stats.add_stats`` / ``Stats.stats_summary``:

* every attempt counts, failed ones and both hops of a split transfer included;
* bytes are the sizes recorded for attempts with a local (``file``) end, as it was when
  the attempt ended, so a failed attempt from a local source still adds the full source
  size, and a failed download nothing (its file was never renamed into place);
* a single attempt without a local end suppresses all numbers (the stock code sets a
  "third party" flag), even if every other attempt was local;
* "no local files" is printed only when there were no attempts at all (mkdir-only or
  remove-only runs), despite its wording;
* every line uses the same total: the wall time of the whole run, not a sum of
  attempt durations. Site pairs appear in order of first appearance.

The library returns the lines; the caller logs them at INFO.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence

    from pegasus_cloudio.dropin.monitoring import AttemptRecord

__all__ = ["format_stats", "iso_prefix_formatted"]

NO_TRANSFERS = "Stats: no local files in the transfer set"
THIRD_PARTY = "Unable to provide stats for third party gsiftp/srm transfers"
_UNITS = ((1024.0 ** 4, "T"), (1024.0 ** 3, "G"), (1024.0 ** 2, "M"), (1024.0, "K"))


def iso_prefix_formatted(n: float) -> str:
    """Return ``n`` as the stock ``"%.1f %s"`` with a 1024-based prefix (``"1.3 K"``).

    A prefix is used only when ``n`` is strictly greater than its unit, so exactly 1024
    is ``"1024.0 "``. The caller appends ``B``, ``B/s`` or ``b/s``.
    """
    value = float(n)
    for unit, prefix in _UNITS:
        if value > unit:
            return "%.1f %s" % (value / unit, prefix)
    return "%.1f " % value


def _span(records: "Sequence[AttemptRecord]") -> float:
    """Seconds from the first attempt's start to the last attempt's end."""
    first = min(r.start for r in records)
    last = max(r.start + r.duration for r in records)
    return last - first


def _line(head: str, count: int, nbytes: int, seconds: float) -> str:
    # The stock code divides by the run's wall time, which is never 0; a caller-supplied
    # 0 gives a rate of 0 instead of ZeroDivisionError.
    rate = nbytes / seconds if seconds > 0 else 0.0
    return "%s%d transfers, %sB transferred in %.0f seconds. Rate: %sB/s (%sb/s)" % (
        head, count, iso_prefix_formatted(nbytes), seconds,
        iso_prefix_formatted(rate), iso_prefix_formatted(rate * 8),
    )


def format_stats(records: "Sequence[AttemptRecord]", total_seconds: "Optional[float]" = None) -> "List[str]":
    """Return the summary lines (without log prefix) for all attempts of a run.

    ``total_seconds`` should be the run's wall time (the stock tool measures from start-up
    to the end of the last transfer round); when None, the span of the records is used.
    Returns one line for the "no transfers" and "third party" cases, otherwise the
    ``Stats: Total ...`` line followed by one indented ``Between sites a->b : ...`` line
    per site pair (labels with ``-`` written as ``_``, as the stock tool stores them).
    """
    if not records:
        return [NO_TRANSFERS]
    if not all(r.local_file for r in records):
        return [THIRD_PARTY]
    from pegasus_cloudio.dropin.monitoring import stock_label
    seconds = _span(records) if total_seconds is None else total_seconds
    counts: "Dict[str, int]" = {}
    sizes: "Dict[str, int]" = {}
    for record in records:
        key = stock_label(record.src_label) + "->" + stock_label(record.dst_label)
        counts[key] = counts.get(key, 0) + 1
        sizes[key] = sizes.get(key, 0) + record.bytes
    lines = [_line("Stats: Total ", len(records), sum(sizes.values()), seconds)]
    for key, count in counts.items():
        lines.append(_line("       Between sites %s : " % key, count, sizes[key], seconds))
    return lines

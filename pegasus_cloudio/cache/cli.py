"""Inspect and maintain the node cache: stats, ls, verify, gc, clear.

``pegasus-cloudio cache stats`` shows hits, misses, bytes and requests saved, summed over
every process that used the cache directory; ``ls`` lists entries (least recently used
first); ``verify`` checks every entry's size and SHA-256 and removes corrupt ones; ``gc``
evicts down to the low watermark when above the high one; ``clear`` removes every entry
not in use nor pinned (handed out as a symlink within ``PIN_SECONDS``: a job may still read
it). The directory is ``--dir``, else ``PEGASUS_CLOUDIO_CACHE_DIR``, else the per-user default.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Mapping, Optional

from transfer.cache import CacheConfig, EntryInfo, NodeCache, config_from_env
from transfer.config import parse_size
from transfer.knobs import layered
from transfer.errors import TransferError

ACTIONS = ("stats", "ls", "verify", "gc", "clear")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", help="cache directory (default: PEGASUS_CLOUDIO_CACHE_DIR, else "
                        "$XDG_CACHE_HOME/pegasus-cloudio, else ~/.cache/pegasus-cloudio)")
    actions = parser.add_subparsers(dest="action", required=True)
    for name, text in (("stats", "hits, misses, bytes and requests saved"),
                       ("ls", "entries, least recently used first"),
                       ("verify", "check sizes and checksums; remove corrupt entries"),
                       ("gc", "evict per the watermarks (never entries in use)"),
                       ("clear", "remove every entry not in use nor pinned")):
        sub = actions.add_parser(name, help=text, parents=[common])
        if name in ("stats", "ls"):
            sub.add_argument("--json", action="store_true", help="print machine-readable JSON")
        if name == "gc":
            sub.add_argument("--max-bytes", type=parse_size, help="size cap for this run (e.g. 5G)")


def main(args: argparse.Namespace) -> int:
    try:
        config = _config(args)
        if config is None:
            print("pegasus-cloudio cache: the cache is off (PEGASUS_CLOUDIO_CACHE_DIR=off); "
                  "name one with --dir", file=sys.stderr)
            return 2
        cache = NodeCache(config)
        return _run(cache, args)
    except (TransferError, OSError, ValueError) as err:
        print(f"pegasus-cloudio cache: {err}", file=sys.stderr)
        return 2


def _config(args: argparse.Namespace, env: Optional[Mapping[str, str]] = None) -> Optional[CacheConfig]:
    """--dir and --max-bytes, then the environment (default ``os.environ``), then the config file
    (:mod:`transfer.knobs`)."""
    max_bytes = getattr(args, "max_bytes", None)
    return config_from_env(layered(env, config_file=True, command_line={
        "PEGASUS_CLOUDIO_CACHE_DIR": os.path.abspath(args.dir) if args.dir else None,
        "PEGASUS_CLOUDIO_CACHE_MAX_BYTES": str(max_bytes) if max_bytes else None}))


def _run(cache: NodeCache, args: argparse.Namespace) -> int:
    if args.action == "stats":
        stats = cache.stats().as_dict()
        print(json.dumps(stats, indent=2) if args.json else format_stats(cache.config, stats))
    elif args.action == "ls":
        entries = cache.entries()
        print(json.dumps([entry_dict(e) for e in entries], indent=2) if args.json
              else format_entries(entries))
    elif args.action == "verify":
        bad = cache.verify()
        for key in bad:
            print(f"removed corrupt entry: {key}")
        print(f"{len(bad)} corrupt entr{'y' if len(bad) == 1 else 'ies'} removed")
    elif args.action == "gc":
        print(f"freed {human(cache.gc())}")
    else:
        kept = cache.clear()
        print(f"cleared {cache.directory}" + (f" ({kept} pinned entr{'y' if kept == 1 else 'ies'} kept: "
                                              "a job holds a symlink to it)" if kept else ""))
    return 0


def format_stats(config: CacheConfig, stats: Dict[str, int]) -> str:
    lookups = stats["hits"] + stats["misses"]
    ratio = f"{100.0 * stats['hits'] / lookups:.1f} %" if lookups else "-"
    rows = [
        ("cache", config.directory),
        ("entries", f"{stats['entries']} ({human(stats['bytes'])} of a {human(config.max_bytes)} cap; "
                    f"gc above {config.high_watermark:.0%}, down to {config.low_watermark:.0%})"),
        ("hits", str(stats["hits"])),
        ("misses", str(stats["misses"])),
        ("hit ratio", ratio),
        ("bytes saved", human(stats["bytes_saved"])),
        ("requests saved", str(stats["requests_saved"])),
        ("uncached", str(stats["uncached"])),
        ("inserts", str(stats["inserts"])),
        ("evictions", f"{stats['evictions']} ({human(stats['bytes_evicted'])})"),
    ]
    return "\n".join(f"{name:<15} {value}" for name, value in rows)


def entry_dict(entry: EntryInfo) -> Dict[str, object]:
    meta = entry.meta
    return {"key": entry.key, "size": entry.size, "last_used": entry.last_used, "links": entry.links,
            "pinned_until": entry.pinned_until or None, "digest": entry.digest,
            "version": meta.version if meta else None, "source": meta.source if meta else None,
            "created": meta.created if meta else None}


def format_entries(entries: List[EntryInfo]) -> str:
    lines = [f"{'LAST USED':<19}  {'SIZE':>10}  {'LINKS':>5}  {'SOURCE':<8}  KEY"]
    for entry in entries:
        used = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.last_used))
        source = entry.meta.source if entry.meta else "?"
        lines.append(f"{used:<19}  {human(entry.size):>10}  {entry.links:>5}  {source:<8}  {entry.key}")
    lines.append(f"{len(entries)} entries, {human(sum(e.size for e in entries))}")
    return "\n".join(lines)


def human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"

"""Cache-aware scheduling: what a node holds, as a ClassAd attribute, and job ranks that use it.

Each worker publishes what its caches hold in its machine ad. HTCondor runs startd cron jobs
as ``condor``, which cannot read users' private caches, so root writes the summary to a file
(``cache-summary --write FILE``, a systemd timer) and the startd cron prints it
(``cache-summary --read FILE``; :mod:`.summary_file`). The ad (also what plain
``cache-summary`` prints, from the caches the caller can read)::

    PegasusCloudioCache = "3fa2c1,9b0e77,..."     one short id per entry of the served caches
    PegasusCloudioCacheFiles = 12345
    PegasusCloudioNode = "worker-17"

A short id is the first ``ID_CHARS`` (6) hex digits of the SHA-256 of the entry's cache key,
which is also the entry's file name, so listing the cache reads no file. Six digits keep a
summary of 10,000 files at about 70 KB with a 0.06 % chance that a job's input is wrongly
counted as present (which only costs a slightly worse placement: the job still transfers
correctly). ``PEGASUS_CLOUDIO_P2P_SUMMARY_MAX`` caps the ids: each served cache gets an equal
share, of its most recently used entries (:func:`summarise`).

:func:`rank_expression` builds a job's ``condor.rank`` from its inputs' cache keys and sizes:
the megabytes of the job's inputs the machine holds (0 on machines without a summary). The
Pegasus helper :func:`add_cache_rank` sets it on every job of a workflow whose inputs it can
name (a site-wide profile cannot know a job's inputs).
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import socket
import sys
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from transfer.cache.layout import OBJECTS, digest_of
from transfer.errors import InvalidInput
from transfer.knobs import layered, origin_of
from transfer.p2p.config import ENV

from . import summary_file
from .settings import served_caches

__all__ = ["ATTRIBUTE", "add_cache_rank", "classad_text", "rank_expression", "short_id", "summarise"]

ATTRIBUTE = "PegasusCloudioCache"
ID_CHARS = 6
DEFAULT_MAX = 50_000
_HEX = set("0123456789abcdef")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def short_id(cache_key: str) -> str:
    return digest_of(cache_key)[:ID_CHARS]


def summarise(cache_dirs: Iterable[str], limit: int = DEFAULT_MAX,
              unreadable: Optional[List[str]] = None, errors: Optional[Dict[str, OSError]] = None) -> List[str]:
    """Short ids of every entry in ``cache_dirs`` (sorted). When there are more than ``limit``,
    each cache gets an equal share of the ids (what a cache leaves of its share goes to the
    others), filled with its most recently used entries: the times are the users' to set, so
    they order only each user's own entries, and no user can push another's out. A cache
    directory that cannot be read is skipped (appended to ``unreadable``, its error kept in
    ``errors``). No link is followed but root's on the way to a cache (root runs this on
    users' caches: :func:`open_directory`), and a cache is listed up to ``16 * limit``
    directory entries (shards and their entries, as they are read: no more of a directory
    is held in memory)."""
    found: List[List[Tuple[float, str]]] = []
    for directory in cache_dirs:
        entries: List[Tuple[float, str]] = []
        try:
            _scan(directory, entries, 16 * limit)
        except OSError as err:
            if unreadable is not None:
                unreadable.append(directory)
            if errors is not None:
                errors[directory] = err
            continue
        found.append(entries)
    ids: Set[str] = set()
    for entries, share in zip(found, shares([len(e) for e in found], limit)):
        ids.update(name for _, name in (sorted(entries, reverse=True)[:share] if share < len(entries) else entries))
    return sorted(ids)


def shares(counts: Sequence[int], limit: int) -> List[int]:
    """How many of ``limit`` places each of the caches holding ``counts`` entries gets: equal
    shares, the places a smaller cache leaves shared among the bigger ones."""
    given = [0] * len(counts)
    left = limit
    order = sorted(range(len(counts)), key=lambda n: counts[n])
    for place, n in enumerate(order):
        given[n] = min(counts[n], left // (len(order) - place))
        left -= given[n]
    return given


_MAX_LINKS = 40  # as the kernel's path walk


def open_directory(path: str) -> int:
    """A descriptor of the directory ``path``, walked one component at a time from ``/``
    without following any link but root's on the way (``/home`` -> ``/srv/home``; the
    directory itself is never one): a user owns the components of the path to her cache
    below her home, and a link of hers there (``.cache`` -> another user's) would lead root
    into files she chose. Raises OSError (ELOOP for such a link, or too many)."""
    parts = [p for p in os.path.abspath(path).split("/") if p]
    fd = os.open("/", _DIR_FLAGS)
    links = 0
    try:
        while parts:
            part = parts.pop(0)
            if part == "..":  # a root link's target may climb: stay on what was walked
                parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = parent
                continue
            st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if st.st_uid != 0 or not parts or links > _MAX_LINKS:
                    raise OSError(errno.ELOOP, "a link of another user's on the way, or as the directory", part)
                target = os.readlink(part, dir_fd=fd)
                parts[:0] = [p for p in target.split("/") if p and p != "."]
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _DIR_FLAGS)
                continue
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)  # O_NOFOLLOW: a link swapped in meanwhile fails
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _scan(directory: str, entries: List[Tuple[float, str]], budget: int) -> None:
    root = open_directory(directory)
    try:
        objects = os.open(OBJECTS, _DIR_FLAGS, dir_fd=root)
    except FileNotFoundError:
        return
    finally:
        os.close(root)
    try:
        with os.scandir(objects) as it:  # not listdir: its names count against the budget as they come
            for item in it:
                budget -= 1
                if budget < 0:
                    break
                if len(item.name) != 2:
                    continue
                try:
                    fd = os.open(item.name, _DIR_FLAGS, dir_fd=objects)
                except OSError:
                    continue
                try:
                    budget = _scan_shard(fd, entries, budget)
                finally:
                    os.close(fd)
    finally:
        os.close(objects)


def _scan_shard(fd: int, entries: List[Tuple[float, str]], budget: int) -> int:
    with os.scandir(fd) as it:
        for item in it:
            budget -= 1
            if budget < 0:
                break
            name = item.name
            if len(name) == 64 and set(name) <= _HEX:
                entries.append((_last_use(fd, name), name[:ID_CHARS]))
    return budget


def _last_use(shard_fd: int, name: str) -> float:
    try:
        return os.stat(name + ".meta", dir_fd=shard_fd, follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def classad_text(ids: Sequence[str], node: str) -> str:
    """The startd cron output (one ad, attributes one per line)."""
    return (f'{ATTRIBUTE} = "{",".join(ids)}"\n'
            f"{ATTRIBUTE}Files = {len(ids)}\n"
            f'PegasusCloudioNode = "{node}"\n')


def rank_expression(inputs: Iterable[Tuple[str, int]]) -> str:
    """``condor.rank`` for a job reading ``inputs`` (cache key, size in bytes): the MB of them
    the machine holds; inputs of the same short id count once."""
    weights: Dict[str, float] = {}
    for key, size in inputs:
        ident = short_id(key)
        weights[ident] = max(weights.get(ident, 0.0), max(size, 1) / 1e6)
    if not weights:
        return "0"
    # regexp rather than stringListMember: the list functions evaluate to an error in the
    # classad2 bindings (25.x), and an anchored hex pattern is exact on a comma list.
    terms = " + ".join(f'ifThenElse(regexp("(^|,){i}(,|$)", TARGET.{ATTRIBUTE}), {w:.6g}, 0)'
                       for i, w in sorted(weights.items()))
    return f"ifThenElse(isString(TARGET.{ATTRIBUTE}), {terms}, 0)"


def add_cache_rank(workflow: Any, urls: Mapping[str, str], *, env: Optional[Mapping[str, str]] = None,
                   sizes: Optional[Mapping[str, int]] = None) -> int:
    """Give every job of a Pegasus ``workflow`` (Pegasus.api.Workflow) a ``condor.rank`` profile
    preferring machines whose caches hold its inputs; returns how many jobs got one.

    ``urls`` maps an input's LFN to the URL the jobs read it from (the replica catalog's or
    the staging site's); ``sizes`` its size in bytes (else ``File.size``, else 1). Cache keys
    are computed as the workers compute them, so ``env`` must name the same credentials
    (default: this process's environment). Inputs without a URL are ignored."""
    from Pegasus.api import Namespace
    from transfer.session import Session
    from transfer.urls import parse_url

    count = 0
    with Session(env=dict(os.environ) if env is None else env) as session:
        for job in workflow.jobs.values():
            inputs = [(_cache_key(session, parse_url(urls[f.lfn])), _size(f, sizes))
                      for f in _inputs(job) if f.lfn in urls]
            if inputs:
                job.add_profiles(Namespace.CONDOR, key="rank", value=rank_expression(inputs))
                count += 1
    return count


def _inputs(job: Any) -> List[Any]:
    """The job's input File objects (``Job.get_inputs()`` returns Files in Pegasus 5.1)."""
    return [getattr(f, "file", f) for f in job.get_inputs()] if hasattr(job, "get_inputs") else []


def _size(f: Any, sizes: Optional[Mapping[str, int]]) -> int:
    if sizes and f.lfn in sizes:
        return int(sizes[f.lfn])
    return int(getattr(f, "size", None) or 1)


def _cache_key(session: Any, url: Any) -> str:
    from transfer.backends.base import CacheKeys
    backend = session.backend(url)
    return str(backend.cache_key(url)) if isinstance(backend, CacheKeys) else str(url)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max", type=int, default=None, help=f"cap on ids (default {DEFAULT_MAX})")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", metavar="FILE",
                      help="as root: write the summary to FILE (atomically, mode 0644) instead of printing it")
    mode.add_argument("--read", metavar="FILE",
                      help="as the startd cron (user condor): print the summary root wrote to FILE")
    parser.add_argument("--max-age", type=float, default=summary_file.DEFAULT_MAX_AGE_S,
                        help="with --read: a FILE older than this many seconds counts as absent "
                             "(default %(default)s)")


def main(args: argparse.Namespace) -> int:
    if args.read:
        return _print_published(args.read, args.max_age)
    try:
        caches, limit, node = summary_settings(args, os.environ)
    except (ValueError, OSError) as err:  # InvalidInput is a ValueError
        summary_file.warn(str(err))
        return 2
    unreadable: List[str] = []
    errors: Dict[str, OSError] = {}
    text = classad_text(summarise(caches.values(), limit, unreadable, errors), node)
    for directory in unreadable:
        summary_file.warn(_unreadable(directory, errors.get(directory), bool(args.write)))
    if not args.write:
        sys.stdout.write(text)
        return 0
    try:
        summary_file.publish(args.write, text)
    except OSError as err:
        summary_file.warn(f"cannot write {args.write}: {err.strerror}")
        return 1
    return 0


def _unreadable(directory: str, err: Optional[OSError], writing: bool) -> str:
    """The one line for a cache ``cache-summary`` skipped, with advice for its cause."""
    if err is not None and err.errno == errno.ELOOP:
        return (f"refusing cache {directory} (skipped): a symbolic link not root's on its path, or the cache "
                "itself a link, could lead root into another user's files; name the cache by its real path "
                f"in {ENV}USERS")
    if err is not None and err.errno in (errno.EACCES, errno.EPERM) and not writing and os.geteuid() != 0:
        return (f"cannot read cache {directory} (skipped); the startd cron runs as condor: run "
                "`cache-summary --write FILE` as root and `--read FILE` as the cron (docs/p2p.md)")
    reason = err.strerror if err is not None and err.strerror else "unreadable"
    return f"cannot read cache {directory} (skipped): {reason}"


def _print_published(path: str, max_age: float) -> int:
    node = os.environ.get(ENV + "NODE") or socket.gethostname()
    try:
        text = summary_file.published(path, max_age)
    except summary_file.SummaryFileError as err:
        summary_file.warn(str(err))
        return 1
    if text is None:
        summary_file.warn(f"{path} is missing or older than {max_age:g} s: publishing an empty summary")
        text = classad_text([], node)
    sys.stdout.write(text)
    return 0


def summary_settings(args: argparse.Namespace, env: Mapping[str, str]) -> Tuple[Dict[str, str], int, str]:
    """(caches served, id cap, node name): ``--max`` over the environment over the config file."""
    given = None if args.max is None else str(args.max)
    values = layered(env, config_file=True, command_line={ENV + "SUMMARY_MAX": given})
    caches = served_caches(values.get(ENV + "USERS", ""))
    return caches, _limit(values), values.get(ENV + "NODE") or socket.gethostname()


def _limit(values: Mapping[str, str]) -> int:
    """``P2P_SUMMARY_MAX``: a whole number above 0; InvalidInput naming it and its source."""
    name = ENV + "SUMMARY_MAX"
    text = values.get(name, str(DEFAULT_MAX)).strip()
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise InvalidInput(f"{name}{origin_of(values, name)} must be a whole number above 0 (got {text!r})",
                           operation="config")
    return int(text)

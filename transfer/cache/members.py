"""Bundle members into the node cache, one batch per bundle (:meth:`NodeCache.insert_members`).

Imported at the first batch: only a job that reads bundle members with the node cache on
loads it. The members are ``(key, bytes, sha256)``, already verified by the caller against
``sha256``, which is recorded, not recomputed.

For one batch: one free-space check, one reservation of its bytes under the size cap
(:meth:`Entries.reserve`; what is not stored is given back) and one read of the umask, then per
member, under its key's exclusive lock (a key whose lock file the batch creates has no entry
nor metadata: nothing to check or clear), its metadata written in place (no entry exists while
the lock is held, so nothing trusts it half-written), its bytes in a new temp file and the
cache's one publishing step (:meth:`Entries.make_entry`: fsync where a hit does not re-hash,
0444 less the umask, one rename that makes the entry); or, for a member the job already wrote
into the cache and linked as its file (``temps``), that file renamed into the entry. An
existing valid entry of the same object stays, checked by size and time only (not re-hashed),
and so does one published after the members were read (``read_at``: inserts behind a job's
answer, whose bytes may be of an object replaced since). With ``dests`` (one list of paths per
member), each stored member is also materialised at its paths under its lock, as a hit would be
(hard links where the cache hands out links); where an older entry stayed, the destinations get
the caller's verified bytes.
Errors writing a destination propagate (the job's own); the cache's own errors only end the
batch early (logged): the caller writes the destinations of members not returned itself.

A process killed half-way leaves complete entries and, for the member in hand, at most a
metadata file and a temp file without an entry, which the next fill of that key removes:
never an entry a later job would trust.

:class:`~transfer.cache.store.NodeCache`'s method delegates here; these functions use the
layer below both, :class:`~transfer.cache.entries.Entries` (the validity check, the publishing
step and the usage counters), and take each key's lock themselves.
"""

from __future__ import annotations

import os
import time

from transfer.atomic import atomic_write_bytes, untrack_temp, write_all
from transfer.cache.layout import ENTRY_MODE, FILE_MODE, KeyPaths, Meta, remove_quietly, write_meta_in_place
from transfer.cache.locks import Held, acquire_new
from transfer.cache.materialise import materialise
from transfer.errors import TransferError
from transfer.lean import logger

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional, Sequence, Tuple

    from transfer.cache.entries import Entries

_log = logger("transfer.cache.store")  # one logger for the cache's warnings


def insert_members(entries: Entries, members: Sequence[Tuple[str, bytes, str]], version: Optional[str] = None,
                   dests: Optional[Sequence[Sequence[str]]] = None, source: str = "bundle",
                   read_at: Optional[float] = None, *, versions: Optional[Sequence[Optional[str]]] = None,
                   read_ats: Optional[Sequence[Optional[float]]] = None,
                   temps: Optional[Sequence[Optional[str]]] = None) -> List[str]:
    """Store verified bundle members, ``(key, bytes, sha256)`` each: the keys stored (see above).
    ``read_at``: when the members' bytes were read, for inserts made later (behind a job's
    answer); an entry published after then is of the object as it was later, and stays.
    ``versions`` and ``read_ats``, one per member, take the place of ``version`` and ``read_at``
    (a batch of objects read one by one: :func:`transfer.cache.behind.drain`). ``temps``, one
    per member or None: a temp file of the key holding the member's bytes, read-only, that the
    job already has as its file (:meth:`NodeCache.stage_linked`): a new key's entry is that file,
    renamed (written once); otherwise it is removed and the bytes are written as without it."""
    batch = _Batch(entries, members, version, dests, source, read_at, versions, read_ats, temps)
    wanted = [n for n, m in enumerate(members) if len(m[1]) <= entries.config.max_bytes]
    size = sum(len(members[n][1]) for n in wanted)
    reserved = 0
    try:
        if wanted and entries.has_room(size) and entries.reserve(size):
            reserved = size
            batch.store(wanted)
    except TransferError:
        raise
    except OSError as err:
        _log.warning("cache %s: cannot insert bundle members: %s", entries.directory, err)
    finally:
        batch.end(reserved)
    return batch.stored


class _Batch:
    """An :func:`insert_members` call: its arguments, the keys stored and the bytes written."""

    __slots__ = ("entries", "members", "version", "dests", "source", "read_at", "versions", "read_ats", "temps",
                 "staged", "stored", "written")

    def __init__(self, entries: Entries, members: Sequence[Tuple[str, bytes, str]], version: Optional[str],
                 dests: Optional[Sequence[Sequence[str]]], source: str, read_at: Optional[float],
                 versions: Optional[Sequence[Optional[str]]], read_ats: Optional[Sequence[Optional[float]]],
                 temps: Optional[Sequence[Optional[str]]]) -> None:
        self.entries, self.members, self.version, self.dests, self.source = entries, members, version, dests, source
        self.read_at, self.versions, self.read_ats, self.temps = read_at, versions, read_ats, temps
        self.staged = {n for n, temp in enumerate(temps or ()) if temp is not None}  # unused ones: removed at the end
        self.stored: List[str] = []
        self.written = 0

    def store(self, wanted: List[int]) -> None:
        """Store the members ``wanted`` (their bytes reserved), with their destinations."""
        entries, members, temps, dests, source = self.entries, self.members, self.temps, self.dests, self.source
        kept = entries.less_umask(0o777)  # the umask, read once per batch (a file of /proc)
        mode = ENTRY_MODE & kept
        private = FILE_MODE & kept == FILE_MODE  # a new key's metadata then needs no fchmod
        for n in wanted:
            key, data, sha256 = members[n]
            paths = entries.paths(key)
            fd, new_key = acquire_new(paths.lock)
            with Held(fd):
                temp = None if temps is None else temps[n]
                self.staged.discard(n)
                version = self.version if self.versions is None else self.versions[n]
                written = temp is not None and _publish_linked(entries, paths, members[n], version, source, temp,
                                                               private, new_key)
                if not written:
                    written = _put_member(entries, paths, members[n], version, source,
                                          self.read_at if self.read_ats is None else self.read_ats[n], mode,
                                          new_key, private)
                self.written += len(data) if written else 0
                for dest in dests[n] if dests is not None else ():
                    if written:
                        materialise(paths.data, dest, hardlink=entries.config.hardlink)
                    else:  # an older entry passed only the cheap check: the job gets the verified bytes
                        atomic_write_bytes(dest, data)
            self.stored.append(key)

    def end(self, reserved: int) -> None:
        """Remove the unused temps, give back what of ``reserved`` was not written, collect."""
        for n in self.staged:
            remove_quietly(self.temps[n])  # type: ignore[index,arg-type]  # staged: indexes of temps given
        unused = reserved - self.written if reserved else 0
        if unused:
            self.entries.adjust_usage(0, -unused)
        self.entries.gc_if_due()


def _put_member(entries: Entries, paths: KeyPaths, member: Tuple[str, bytes, str], version: Optional[str],
                source: str, read_at: Optional[float], mode: int, new_key: bool, private: bool) -> bool:
    """One member ``(key, bytes, sha256)``; the caller holds its key's exclusive lock, which it
    created when ``new_key`` (:func:`acquire_new`: the key has no other file, so nothing to
    look at or clear). True when this call wrote the entry, ``mode`` its permissions (0444
    less the umask); False when an existing entry stays: one of the same object (checked by
    size and time only, not re-hashed: so the caller does not hand its bytes to a job), or one
    published after ``read_at`` (a newer read than ours, of an object replaced since). The
    metadata comes first (with the data's modification time chosen now and set on the data
    file), so a temp file of this key never exists without it: whatever a killed insert
    leaves, the next fill finds and removes. ``private``: the umask takes nothing of 0600 (a
    new key's metadata is then made without ``fchmod``). Raises OSError."""
    key, data, sha256 = member
    if not new_key and _stays(entries, paths, key, version, sha256, read_at):
        return False
    stamp = time.time_ns()
    write_meta_in_place(paths, Meta(key, len(data), sha256, stamp, time.time(), version, source),
                        new_private=new_key and private)
    temp = None
    try:
        fd, temp = paths.open_temp()
        try:
            write_all(fd, data)
            os.utime(fd, ns=(stamp, stamp))
            entries.make_entry(paths, fd, temp, len(data), mode)
        finally:
            os.close(fd)
    except BaseException:
        if temp is not None:  # else the metadata stays for the next fill to find and remove
            remove_quietly(temp)
            remove_quietly(paths.meta)
        raise
    untrack_temp(temp)
    entries.restamp(paths, len(data))
    entries.adjust_usage(1, 0)  # its bytes: reserved for the batch
    entries.counters.add(inserts=1)
    return True


def _stays(entries: Entries, paths: KeyPaths, key: str, version: Optional[str], sha256: str,
           read_at: Optional[float]) -> bool:
    """Whether the entry of ``key`` stays (see :func:`_put_member`); if not, what the key has
    is removed."""
    meta = entries.valid(paths, key)
    if meta is not None and (not meta.changed(version, sha256) or (read_at is not None and meta.created > read_at)):
        return True
    if meta is not None or _exists(paths.meta) or _exists(paths.data):
        entries.remove_invalid(paths)  # else no entry nor metadata: nothing to list
    return False


def _publish_linked(entries: Entries, paths: KeyPaths, member: Tuple[str, bytes, str], version: Optional[str],
                    source: str, temp: str, private: bool, new_key: bool) -> bool:
    """A new key (``new_key``: its lock just made by the caller, held exclusive): its entry is
    ``temp``, the read-only file the job made of the member's bytes and linked as its own, renamed into
    place after its metadata (its size must still be the bytes', its modification time is
    recorded; entries this small are re-hashed on every hit, so bytes changed in it since are
    caught there). False, nothing published and ``temp`` removed (not a crashed writer's
    leftover: ours, unused), when the key is not new or ``temp`` is gone or changed.
    ``private`` as :func:`_put_member`'s. Raises OSError."""
    key, data, sha256 = member
    try:
        st = os.stat(temp) if new_key else None
    except FileNotFoundError:
        st = None  # another process's cleaning took it
    if st is None or st.st_size != len(data) or not entries.config.verifies(st.st_size):
        remove_quietly(temp)
        return False
    write_meta_in_place(paths, Meta(key, st.st_size, sha256, st.st_mtime_ns, time.time(), version, source),
                        new_private=private)
    try:
        os.replace(temp, paths.data)
    except BaseException as err:
        remove_quietly(paths.meta)
        if isinstance(err, FileNotFoundError):
            return False  # cleaned away since the stat
        raise
    entries.adjust_usage(1, 0)  # its bytes: reserved for the batch
    entries.counters.add(inserts=1)
    return True


def _exists(path: str) -> bool:
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    return True

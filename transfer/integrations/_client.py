"""The one seam between the engine integrations and the library.

The integrations use only the methods listed in :class:`ClientLike` (the shape of the
library's plain API); :func:`open_client` builds one. Until that API lands this is a small
stand-in over :class:`~transfer.session.Session` and :class:`~transfer.engine.Engine`.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Iterable, List, Mapping, Optional, Protocol, Sequence, Tuple

from transfer.backends.base import namespace
from transfer.config import Settings
from transfer.engine import Engine
from transfer.errors import NotFound, TransferError
from transfer.ops import Mkdir, Remove, Result, Transfer
from transfer.session import Session
from transfer.urls import Url, parse_url

__all__ = ["ClientLike", "Entry", "open_client"]


@dataclass(frozen=True)
class Entry:
    """A file or a directory (prefix); ``mtime`` in epoch seconds when the store gives one."""

    url: str
    name: str
    size: int
    is_dir: bool
    version: Optional[str] = None
    mtime: Optional[float] = None


class ClientLike(Protocol):
    def copy(self, pairs: Iterable[Tuple[str, str]], *, check: bool = True) -> List[Result]: ...

    def info(self, url: str) -> Entry: ...

    def find(self, url: str) -> List[Entry]: ...

    def remove(self, urls: Sequence[str], *, recursive: bool = False) -> None: ...

    def mkdir(self, url: str) -> None: ...

    def close(self) -> None: ...


def open_client(*, endpoint: Optional[str], region: Optional[str], access_key: Optional[str],
                secret_key: Optional[str], session_token: Optional[str], threads: int,
                bundles: bool = False) -> ClientLike:
    """A client for plain ``s3://BUCKET/KEY`` URLs at ``endpoint`` (AWS's when None) with the
    given keys (else the AWS credential chain over this process's environment)."""
    env = dict(os.environ)
    given = {"AWS_ENDPOINT_URL": endpoint, "AWS_REGION": region, "AWS_ACCESS_KEY_ID": access_key,
             "AWS_SECRET_ACCESS_KEY": secret_key, "AWS_SESSION_TOKEN": session_token}
    env.update({k: v for k, v in given.items() if v})
    settings = Settings(threads=threads, bundle=bundles)
    settings.validate()
    return _Client(Session(settings, env), env)


class _Client:
    def __init__(self, session: Session, env: Mapping[str, str]) -> None:
        self.session = session
        self.engine = Engine(session)
        self._env = env

    def _url(self, text: str) -> Url:
        return parse_url(text, env={}) if "://" in text else Url("file", "", text)

    def copy(self, pairs: Iterable[Tuple[str, str]], *, check: bool = True) -> List[Result]:
        results = self.engine.run([Transfer((self._url(src),), self._url(dst)) for src, dst in pairs])
        if check:
            _raise_first(results)
        return results

    def info(self, url: str) -> Entry:
        target = self._url(url)
        try:
            found = self.session.backend(target).stat(target)
            return Entry(url, posixpath.basename(target.path), found.size, False, found.version, found.mtime)
        except NotFound:
            for _ in namespace(self.session.backend(target), target, "list").list(target):
                return Entry(url.rstrip("/"), posixpath.basename(target.path.rstrip("/")), 0, True)
            raise

    def find(self, url: str) -> List[Entry]:
        target = self._url(url)
        lister = namespace(self.session.backend(target), target, "list")
        return [Entry(i.url.full, posixpath.basename(i.url.path), i.size, False, i.version, i.mtime)
                for i in lister.list(target)]

    def remove(self, urls: Sequence[str], *, recursive: bool = False) -> None:
        _raise_first(self.engine.run([Remove(self._url(u), recursive) for u in urls]))

    def mkdir(self, url: str) -> None:
        _raise_first(self.engine.run([Mkdir(self._url(url))]))

    def close(self) -> None:
        self.session.close()


def _raise_first(results: Sequence[Result]) -> None:
    for result in results:
        if not result.ok and result.error is not None:
            raise result.error
    failed = [r for r in results if not r.ok]
    if failed:
        raise TransferError("transfer failed", operation="copy")

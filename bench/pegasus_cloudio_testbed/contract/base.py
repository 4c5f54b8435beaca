"""The fixtures a user provides, and what every case of the contract builds on.

A test class inherits :class:`pegasus_cloudio_testbed.contract.ReadContract` (and the capability
mix-ins its reader claims, :func:`pegasus_cloudio_testbed.contract.mixins_for`) and defines
three fixtures:

``reader``
    The object under test: a backend (:class:`transfer.backends.base.Backend`) or a stack of
    layers (``transfer.layers.Reader``), with at least ``stat`` and ``get``. The fixture
    releases it after the test.
``base_url``
    A URL (``str``, no trailing ``/``) under which this test may write: new and empty for
    each test (a fresh bucket, prefix or directory).
``seed``
    ``seed(key, data)`` stores the object ``base_url + "/" + key`` with the bytes ``data``
    by a path other than the reader (the store's own API, or its files); it creates the
    directories a key needs and must be safe to call from several threads at once.

``url_for(key)`` (optional) turns a key into the reader's :class:`transfer.urls.Url`; by
default ``parse_url(base_url + "/" + key)``. Override it where the URL needs more: a site
label for credentials, or percent-escapes (HTTP sends the path as written).
"""

from __future__ import annotations

import functools
import io
import os
from typing import Any, Callable, Iterator, List

import pytest

from transfer import parse_url
from transfer.backends.base import Backend, ObjectInfo
from transfer.urls import Url

Seed = Callable[[str, bytes], None]
UrlFor = Callable[[str], Url]

# Keys a store must keep apart and give back as written (space, plus, percent, unicode, tilde).
AWKWARD_KEYS = ("with space.bin", "plus+sign.bin", "per%25cent.bin", "unicod\u00e9-\u6587\u5b57.bin",
                "tilde~and=equals.bin", "question?mark.bin", "hash#tag.bin", "amp&semi;colon.bin",
                "quote'and\"double.bin", "a  two  spaces .bin")


class ContractBase:
    """The fixture contract (see the module's docstring) and small helpers for the cases."""

    @pytest.fixture
    def url_for(self, base_url: str) -> UrlFor:
        def url(key: str) -> Url:
            return parse_url(f"{base_url}/{key}")
        return url

    @staticmethod
    def read(reader: Backend, url: Url) -> bytes:
        """The whole object's bytes through ``reader.get``."""
        sink = io.BytesIO()
        info = reader.get(url, sink)
        assert info.size == len(sink.getvalue()), f"get of {url} said {info.size} bytes, wrote {len(sink.getvalue())}"
        return sink.getvalue()

    @staticmethod
    def local_file(directory: "os.PathLike[str]", data: bytes, name: str = "upload.tmp") -> str:
        """A local file holding ``data`` (for uploads), in ``directory``."""
        path = os.path.join(os.fspath(directory), name)
        with open(path, "wb") as fh:
            fh.write(data)
        return path


def known_defect(case: Callable[..., Any], reason: str, raises: Any = None) -> Callable[..., Any]:
    """``case`` as a strict xfail naming the defect, for one test class: a wrapper is marked,
    so the other classes that inherit ``case`` still run it. Use it where a backend (or its
    test server) is known to fail a case::

        test_copy_onto_itself_keeps_the_object = known_defect(
            ServerSideCopyContract.test_copy_onto_itself_keeps_the_object, "mine: copy truncates (#12)")

    Strict: once the defect is mended the case passes and the xfail fails, asking for its removal."""
    @functools.wraps(case)
    def expected_to_fail(*args: Any, **kwargs: Any) -> Any:
        return case(*args, **kwargs)
    marked: Callable[..., Any] = pytest.mark.xfail(strict=True, reason=reason, raises=raises)(expected_to_fail)
    return marked


def keys_of(listed: Iterator[ObjectInfo], base: Url) -> List[str]:
    """The keys of listed objects relative to ``base`` (a directory URL), sorted."""
    prefix = base.path.rstrip("/") + "/"
    keys = []
    for info in listed:
        assert info.url.path.startswith(prefix), f"{info.url} is not under {base}"
        keys.append(info.url.path[len(prefix):])
    return sorted(keys)

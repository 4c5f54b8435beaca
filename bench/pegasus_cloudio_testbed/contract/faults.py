"""Verified bodies under faults: an optional mix-in (no capability claims it) for readers
whose test can put a cutting relay between them and their server.

Besides ``reader``, ``seed`` and ``base_url`` (of a reader that goes through the relay), it
needs ``cut_bodies(after)``: from now on, answers to GETs are cut (the connection closed)
after ``after`` bytes, every time; ``cut_bodies(None)`` ends that. With the test bed's
:class:`~pegasus_cloudio_testbed.proxy.TcpProxy`::

    proxy.set_faults([Fault.truncate(after, times=1000, method="GET")])  # or proxy.clear_faults()
"""

from __future__ import annotations

import io
import os
from typing import Any, Callable, Optional

import pytest

from pegasus_cloudio_testbed.contract.base import ContractBase, Seed, UrlFor
from transfer.errors import TransferError

CutBodies = Callable[[Optional[int]], None]


class CutBodiesContract(ContractBase):
    """A body cut short is never reported whole: ``get`` writes exactly the object (a reader
    may resume a cut body from the byte it reached, verified) or raises a retryable
    TransferError (the engine then retries the file), whole or ranged; and it reads again
    once the cuts stop."""

    def get_under_cuts(self, reader: Any, url: Any, data: bytes, byte_range: Optional[Any] = None) -> bool:
        """Whether the get succeeded; either way, the bytes written are the object's."""
        start, end = byte_range or (0, len(data))
        sink = io.BytesIO()
        try:
            reader.get(url, sink, byte_range=byte_range)
        except TransferError as err:
            assert err.retryable, f"a cut body raised a permanent error: {err!r}"
            assert sink.getvalue() == data[start:start + len(sink.getvalue())], "bytes not of the object were written"
            return False
        assert sink.getvalue() == data[start:end], "a cut body was reported whole"
        return True

    def test_a_body_cut_once_is_resumed_or_refused(self, reader: Any, seed: Seed, url_for: UrlFor,
                                                   cut_bodies: CutBodies) -> None:
        data = os.urandom(300_000)
        seed("cut/once.bin", data)
        cut_bodies(150_000)
        self.get_under_cuts(reader, url_for("cut/once.bin"), data)
        self.get_under_cuts(reader, url_for("cut/once.bin"), data, (1000, 201_000))

    def test_a_body_that_cannot_be_completed_raises(self, reader: Any, seed: Seed, url_for: UrlFor,
                                                    cut_bodies: CutBodies) -> None:
        """Every answer cut after 2,000 bytes: a 1 MB body would take hundreds of resumes."""
        data = os.urandom(1_000_000)
        seed("cut/never.bin", data)
        cut_bodies(2000)
        assert not self.get_under_cuts(reader, url_for("cut/never.bin"), data)
        assert not self.get_under_cuts(reader, url_for("cut/never.bin"), data, (1000, 901_000))
        cut_bodies(None)
        assert self.read(reader, url_for("cut/never.bin")) == data

"""The error tree's one way to put a layer's context on an error from below."""

from __future__ import annotations

import pickle
from typing import Any

from transfer.errors import NotFound, Throttled, TransferError, TransientError


class _Waiting(TransientError):
    """A subclass with an attribute of its own, as a store's throttle answer carries its wait."""

    def __init__(self, message: str, *, wait: float = 0.0, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.wait = wait


def test_relabelled_names_the_new_url_and_operation_and_keeps_the_rest() -> None:
    err = _Waiting("slow down", url="http://127.0.0.1:9/b/k", operation="request", status=503, wait=2.5)
    other = err.relabelled(url="s3://site/b/k", operation="get")
    assert type(other) is _Waiting and other is not err
    assert (other.url, other.operation, other.status, other.wait, other.message) == \
        ("s3://site/b/k", "get", 503, 2.5, "slow down")
    assert str(other) == "get s3://site/b/k: slow down" and other.args == ("slow down",)
    assert (err.url, err.operation) == ("http://127.0.0.1:9/b/k", "request")  # the original is untouched
    assert other.retryable and isinstance(other, ConnectionError)


def test_relabelled_can_replace_the_message() -> None:
    other = NotFound("no such key", url="a").relabelled(url="b", operation="head", message="no such key (from a)")
    assert isinstance(other, FileNotFoundError) and str(other) == "head b: no such key (from a)"


def test_a_relabelled_error_pickles_as_its_class() -> None:
    other = Throttled("slow down", url="a", status=503).relabelled(url="b", operation="put")
    back = pickle.loads(pickle.dumps(other))
    assert type(back) is Throttled and (back.url, back.operation, back.status) == ("b", "put", 503)
    assert isinstance(back, TransferError)

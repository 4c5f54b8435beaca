"""The one exception tree of the transfer library.

::

    TransferError                      every failure the library reports
    ├── InvalidInput (ValueError)      malformed URL, unknown scheme, bad option value
    ├── ConfigError (ValueError)       missing/unsafe credentials file, missing section
    ├── NotFound (FileNotFoundError)   the object or file does not exist       (permanent)
    ├── AlreadyExists (FileExistsError)  an exclusive create found the name taken (permanent)
    ├── AuthError (PermissionError)    rejected credentials or access denied   (permanent)
    ├── RemoteError (OSError)          any other refusal by the server         (permanent)
    ├── LocalIOError (OSError)         writing or reading the local side failed (permanent)
    │   └── NoSpace                    ENOSPC / EDQUOT on the local side
    ├── ChecksumMismatch (ValueError)  received bytes do not match size or checksum (retried)
    ├── TransientError (ConnectionError)  resets, timeouts, 5xx                 (retried)
    │   └── Throttled                  503 SlowDown, 429: retried for a time, not a count
    └── Cancelled                      the caller cancelled the batch before this ran

Every error carries the URL and operation it concerns and the attempts made so far;
backends raise them ``from`` the underlying cause. Whether an error is retried is a
property of its class (:attr:`TransferError.retryable`), never of its message text.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional



class TransferError(Exception):
    """Base class. ``url`` and ``operation`` name what failed; ``attempts`` how often."""

    retryable = False

    def __init__(
        self,
        message: str,
        *,
        url: Optional[str] = None,
        operation: Optional[str] = None,
        attempts: int = 0,
        status: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.url = url
        self.operation = operation
        self.attempts = attempts
        self.status = status

    def __reduce__(self):  # type: ignore[no-untyped-def]
        kwargs = {
            "url": self.url,
            "operation": self.operation,
            "attempts": self.attempts,
            "status": self.status,
        }
        return (_rebuild, (type(self), self.message, kwargs))

    def relabelled(self, *, url: Optional[str], operation: Optional[str],
                   message: Optional[str] = None) -> TransferError:
        """This error naming ``url`` and ``operation`` (and ``message``, if given) instead: same
        class, every other attribute kept (a subclass's too, such as the wait a store asked
        for). The one way a layer puts its own context on an error from the layer below;
        raise it ``from`` this one."""
        other = type(self).__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.message = self.message if message is None else message
        other.args = (other.message,)
        other.url, other.operation = url, operation
        return other

    def __str__(self) -> str:
        parts = []
        if self.operation:
            parts.append(self.operation)
        if self.url:
            parts.append(self.url)
        prefix = " ".join(parts)
        return f"{prefix}: {self.message}" if prefix else self.message


def _rebuild(cls: type, message: str, kwargs: dict) -> TransferError:  # type: ignore[type-arg]
    err: TransferError = cls(message, **kwargs)
    return err


class InvalidInput(TransferError, ValueError):
    """Input the library cannot act on: a malformed URL, an unknown scheme, a bad value."""


class ConfigError(TransferError, ValueError):
    """Credentials or configuration missing, malformed or unsafe (e.g. group-readable)."""


class NotFound(TransferError, FileNotFoundError):
    """The source object or file does not exist."""


class AlreadyExists(TransferError, FileExistsError):
    """An exclusive create (``put_new``) found an object of that name already stored."""


class AuthError(TransferError, PermissionError):
    """The server rejected the credentials or denied access (401/403)."""


class RemoteError(TransferError, OSError):
    """The server refused the request for a reason that retrying will not change."""


class LocalIOError(TransferError, OSError):
    """Reading or writing a local file failed."""


class NoSpace(LocalIOError):
    """The local filesystem is full (ENOSPC) or over quota (EDQUOT)."""


class ChecksumMismatch(TransferError, ValueError):
    """The bytes received do not match the size or checksum the store reported."""

    retryable = True


class TransientError(TransferError, ConnectionError):
    """A failure that may succeed when tried again: reset, timeout, 5xx."""

    retryable = True


class Throttled(TransientError):
    """The server asked the client to slow down (503 SlowDown, 429, GCS 429/503, Azure 503
    ServerBusy). ``retry_after``: the seconds the server asked the client to wait, when it said.

    A request's Throttled is retried for as long as ``PEGASUS_CLOUDIO_THROTTLE_TIMEOUT`` allows
    and draws nothing from the run's retry budget; one that reaches a result is the end of that
    time (its message says so, and the rate achieved): the caller may retry the job later
    (the HTCondor plugin answers "retryable")."""

    def __init__(self, message: str, *, retry_after: Optional[float] = None, **kwargs: object) -> None:
        super().__init__(message, **kwargs)  # type: ignore[arg-type]
        self.retry_after = retry_after

    def __reduce__(self):  # type: ignore[no-untyped-def]
        kwargs = {"url": self.url, "operation": self.operation, "attempts": self.attempts,
                  "status": self.status, "retry_after": self.retry_after}
        return (_rebuild, (type(self), self.message, kwargs))


# Error codes that mean "slow down" whatever the status: S3's and the AWS APIs' (SlowDown,
# RequestLimitExceeded, ...) and Azure Storage's 503 ServerBusy, for a backend that reads codes.
THROTTLE_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
                            "TooManyRequests", "ServerBusy"})


def retry_after_seconds(value: Optional[str]) -> Optional[float]:
    """A ``Retry-After`` field's delay in seconds (RFC 9110 10.2.3: a number of seconds; an
    HTTP date is not read, since the store's clock is not ours), or None when absent or not a
    plain non-negative number."""
    if not value:
        return None
    text = value.strip()
    if not text.isascii() or not text.replace(".", "", 1).isdigit():
        return None
    return float(text)


class Cancelled(TransferError):
    """The caller cancelled the batch (a cancel event, an asyncio cancellation) before this
    operation finished; never retried."""

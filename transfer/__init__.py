"""pegasus-cloudio's transfer library: move many files between local disk and object stores fast.

Typical use::

    from transfer import Engine, Session, Transfer, parse_url

    with Session() as session:
        results = Engine(session, threads=8).run([
            Transfer((parse_url("s3://joe@site/bucket/a.dat"),), parse_url("file:///scratch/a.dat")),
        ])

Importing this package loads no storage SDK; backends are imported on first use.
"""

# What each public name is imported from, on first use (PEP 562): ``import transfer`` costs
# nothing, and a job that needs only the URL parser or the settings imports only those.
_WHERE = {
    "Settings": "transfer.config", "Engine": "transfer.engine", "InlineExecutor": "transfer._workers",
    "Session": "transfer.session", "Url": "transfer.urls", "parse_url": "transfer.urls",
    "RetryBudget": "transfer.retry", "RetryPolicy": "transfer.retry",
    **dict.fromkeys(("Attempt", "LinkMode", "Mkdir", "Operation", "Remove", "Result", "Transfer"), "transfer.ops"),
    **dict.fromkeys(("AuthError", "ChecksumMismatch", "ConfigError", "InvalidInput", "LocalIOError", "NoSpace",
                     "NotFound", "RemoteError", "Throttled", "TransferError", "TransientError"), "transfer.errors"),
}

TYPE_CHECKING = False
if TYPE_CHECKING:
    from transfer._workers import InlineExecutor
    from transfer.config import Settings
    from transfer.engine import Engine
    from transfer.errors import (
        AuthError,
        ChecksumMismatch,
        ConfigError,
        InvalidInput,
        LocalIOError,
        NoSpace,
        NotFound,
        RemoteError,
        Throttled,
        TransferError,
        TransientError,
    )
    from transfer.ops import Attempt, LinkMode, Mkdir, Operation, Remove, Result, Transfer
    from transfer.retry import RetryBudget, RetryPolicy
    from transfer.session import Session
    from transfer.urls import Url, parse_url


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'transfer' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> "list[str]":
    return sorted(set(globals()) | set(_WHERE))


__all__ = [
    "Attempt", "AuthError", "ChecksumMismatch", "ConfigError", "Engine", "InlineExecutor",
    "InvalidInput", "LinkMode", "LocalIOError", "Mkdir", "NoSpace", "NotFound", "Operation",
    "RemoteError", "Remove", "Result", "RetryBudget", "RetryPolicy", "Session", "Settings",
    "Throttled", "TransferError", "TransientError", "Transfer", "Url", "parse_url",
]

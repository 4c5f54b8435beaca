"""pegasus-cloudio's transfer library: move many files between local disk and object stores fast.

Typical use::

    from transfer import Engine, Session, Transfer, parse_url

    with Session() as session:
        results = Engine(session, threads=8).run([
            Transfer((parse_url("s3://joe@site/bucket/a.dat"),), parse_url("file:///scratch/a.dat")),
        ])

Importing this package loads no storage SDK; backends are imported on first use.
"""

from transfer.config import Settings
from transfer.engine import Engine, InlineExecutor
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

__all__ = [
    "Attempt", "AuthError", "ChecksumMismatch", "ConfigError", "Engine", "InlineExecutor",
    "InvalidInput", "LinkMode", "LocalIOError", "Mkdir", "NoSpace", "NotFound", "Operation",
    "RemoteError", "Remove", "Result", "RetryBudget", "RetryPolicy", "Session", "Settings",
    "Throttled", "TransferError", "TransientError", "Transfer", "Url", "parse_url",
]

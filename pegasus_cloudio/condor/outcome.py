"""What the starter learns about each file, and the plugin's exit code.

Exit codes (HTCondor holds the job on any non-zero exit, with
``HoldReasonSubCode = code << 8``; an administrator's ``SYSTEM_PERIODIC_RELEASE`` can
release holds with subcode ``11 << 8`` = 2816, see docs/condor.md):

====  ============================================================================
0     every file succeeded
1     at least one file failed for a reason a retry will not fix (missing object,
      denied access, bad credentials, malformed request, local disk)
3     the plugin could not run at all (usage, missing bindings, unreadable input)
11    every failed file failed transiently (connection refused, reset, timeout, 5xx)
      even after the plugin's own retries: releasing the job later may succeed
====  ============================================================================

``TransferErrorData`` has one entry per failed attempt, with the structured stanza the
HTCondor schema defines (Specification, Authorization, Contact, Resolution, Transfer,
Parameter), chosen by exception class and by the OS error underneath, never by message text.
Every attribute has exactly the type the starter's result filter keeps.

A transfer the store throttled until its time bound ran out (:class:`~transfer.errors.Throttled`,
issue 37) is retryable (``Retryable = 0``, exit code 11): ``ErrorType = "Transfer"``,
``FailureType = "TooSlow"`` (the rate the store allowed was too low to finish in time), so the
job is released and retried later, when the store is less busy, rather than held for good.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any, Dict, Iterator, List, Optional, Sequence
from urllib.parse import unquote

from pegasus_cloudio.condor import PLUGIN_VERSION
from transfer.errors import (
    AuthError,
    ConfigError,
    InvalidInput,
    LocalIOError,
    NoSpace,
    NotFound,
    RemoteError,
    Throttled,
    TransferError,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_PLUGIN = 3
EXIT_TRANSIENT = 11

Fields = Dict[str, Any]


def exit_code(errors: Sequence[TransferError]) -> int:
    """0 when nothing failed; 11 when every failure is retryable; 1 otherwise."""
    if not errors:
        return EXIT_OK
    return EXIT_TRANSIENT if all(err.retryable for err in errors) else EXIT_FAILED


def safe_url(text: str) -> str:
    """A URL fit for messages: query string (signatures) and passwords removed."""
    base, query_mark, _ = text.partition("?")
    scheme, sep, rest = base.partition("://")
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        userinfo, _, host = authority.rpartition("@")
        authority = (userinfo.split(":", 1)[0] + ":***@" if ":" in userinfo else userinfo + "@") + host
    cleaned = f"{scheme}{sep}{authority}{slash}{path}" if sep else base
    return cleaned + ("?<query hidden>" if query_mark else "")


_SECRET_MIN = 12  # query values this long may be signatures, keys or tokens


def scrub(text: str, url: str) -> str:
    """``text`` without what ``url`` carries that may be secret: its query string, each long
    query value (raw or percent-decoded) and a password. For messages that quote the URL in a
    form :func:`safe_url` never saw (a refused request line, an exception's text)."""
    _, mark, query = url.partition("?")
    secrets = [query] if mark and query else []
    for pair in query.split("&") if mark else ():
        value = pair.partition("=")[2]
        secrets += [v for v in (value, unquote(value)) if len(v) >= _SECRET_MIN]
    authority = url.partition("://")[2].split("/", 1)[0]
    if "@" in authority and ":" in authority.rpartition("@")[0]:
        secrets.append(authority.rpartition("@")[0].split(":", 1)[1])
    for secret in sorted(set(s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "<hidden>")
    return text


def causes(err: BaseException) -> Iterator[BaseException]:
    """``err`` and every exception it was raised from."""
    seen = set()
    current: Optional[BaseException] = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _find(err: BaseException, kind: type) -> Optional[BaseException]:
    return next((c for c in causes(err) if isinstance(c, kind)), None)


def is_local(err: TransferError, local_path: str) -> bool:
    """Whether ``err`` concerns the execute node's file rather than the remote side."""
    return isinstance(err, LocalIOError) or (err.url is not None and err.url == local_path)


def contact_server(err: TransferError) -> Optional[str]:
    """``host:port`` of a failed connect, if the error began there."""
    for cause in causes(err):
        if isinstance(cause, TransferError) and cause.operation == "connect" and cause.url:
            return cause.url.partition("://")[2] or cause.url
    return None


def error_entry(err: TransferError, server: str, local_path: str, token: bool) -> Fields:
    """One ``TransferErrorData`` entry for one failed attempt."""
    entry: Fields = {"ErrorCode": _code(err), "ErrorString": err.message,
                     "Retryable": 0 if err.retryable else -1,
                     "DeveloperData": {"ErrorClass": type(err).__name__, "Operation": err.operation or ""}}
    entry.update(_stanza(err, server, local_path, token))
    return entry


def _code(err: TransferError) -> int:
    if err.status:
        return int(err.status)
    for cause in causes(err):
        if isinstance(cause, OSError) and not isinstance(cause, TransferError) and cause.errno:
            return int(cause.errno)  # negative for resolver (EAI_*) errors
    return 1


def _stanza(err: TransferError, server: str, local_path: str, token: bool) -> Fields:
    node = socket.gethostname()
    if isinstance(err, (InvalidInput, ConfigError)):
        return {"ErrorType": "Parameter", "PluginVersion": PLUGIN_VERSION, "PluginLaunched": True}
    if isinstance(err, NoSpace):
        return {"ErrorType": "Transfer", "FailedServer": node, "FailureType": "NoSpace"}
    if _find(err, ssl.SSLCertVerificationError) is not None:
        return {"ErrorType": "Authorization", "FailedServer": server, "FailureType": "Authentication",
                "ShouldRefresh": False}
    if isinstance(err, AuthError):
        kind = "Authentication" if err.status == 401 else "Authorization"
        return {"ErrorType": "Authorization", "FailedServer": node if is_local(err, local_path) else server,
                "FailureType": kind, "ShouldRefresh": token}
    if isinstance(err, NotFound) or (isinstance(err, RemoteError) and err.status == 400):
        return {"ErrorType": "Specification", "FailedServer": node if is_local(err, local_path) else server}
    return _network_stanza(err, server)


def _network_stanza(err: TransferError, server: str) -> Fields:
    if isinstance(err, Throttled):  # the store's rate limit outlasted the time bound: try later
        return {"ErrorType": "Transfer", "FailedServer": server, "FailureType": "TooSlow"}
    resolve = _find(err, socket.gaierror)
    if isinstance(resolve, socket.gaierror):
        definitive = resolve.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME))
        return {"ErrorType": "Resolution", "FailedName": server.rsplit(":", 1)[0],
                "FailureType": "Definitive" if definitive else "PreContact"}
    contacted = contact_server(err)
    if contacted is not None:
        return {"ErrorType": "Contact", "FailedServer": contacted}
    if _find(err, TimeoutError) is not None or _find(err, socket.timeout) is not None:
        return {"ErrorType": "Transfer", "FailedServer": server, "FailureType": "TimedOut"}
    return {}


def error_text(err: TransferError, *, upload: bool, url: str, local: str, attempts: int, source: str) -> str:
    """The ``TransferError`` line a user sees in the hold reason."""
    what = f"upload of {local} to {safe_url(url)}" if upload else f"download of {safe_url(url)}"
    reason = _reason(err, upload, local, source)
    tries = f" (gave up after {attempts} attempts)" if attempts > 1 else ""
    return f"{what[0].upper()}{what[1:]} failed: {reason}{tries}"


def _reason(err: TransferError, upload: bool, local: str, source: str) -> str:
    message = err.message
    if isinstance(err, ConfigError):
        where = f" ({err.url})" if err.url else ""
        return f"credentials problem: {message}{where}; credentials used: {source}"
    if isinstance(err, NoSpace):
        return f"no space left on the execute node for {local} ({message})"
    if is_local(err, local):
        verb = "read" if upload else "write"
        return f"cannot {verb} the local file {local}: {message}"
    if isinstance(err, NotFound):
        return f"the object does not exist ({message})"
    if isinstance(err, AuthError) or _find(err, ssl.SSLCertVerificationError) is not None:
        return f"access denied ({message}); credentials used: {source}"
    if isinstance(err, Throttled):
        return (f"the store kept asking to slow down ({message}) until the transfer's time bound ran out; "
                "retrying later, when it is less busy, may succeed")
    if err.retryable:
        server = contact_server(err)
        if server:
            return f"{message} at {server}; the service may be down, retrying later may succeed"
        if err.status:
            return f"{message}; the service is overloaded or failing, retrying later may succeed"
        return f"{message}; retrying later may succeed"
    return message


def attempt_errors(history: Sequence[Any], final: TransferError) -> List[TransferError]:
    """The error of every failed attempt (at least ``final``)."""
    found = [a.error for a in history if getattr(a, "error", None) is not None]
    return found or [final]


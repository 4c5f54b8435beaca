"""From file ads to one batch of :class:`~transfer.ops.Transfer` operations.

A URL as the starter hands it over may carry a credential prefix (``<name>+https://...``,
HTCondor's convention: everything before the last ``+`` of the scheme). The prefix is
stripped here and remembered; the base scheme must be one the plugin serves. Local names
are taken verbatim (no ``$VAR`` expansion: they are real file names); a relative one is
taken from the job's sandbox.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from pegasus_cloudio.condor.ads import FileAd
from pegasus_cloudio.condor.http_transfers import TokenUrl
from transfer import schemes
from transfer.errors import InvalidInput, TransferError
from transfer.lean import record
from transfer.ops import Transfer
from transfer.urls import Url, parse_url

SERVED = schemes.PLUGIN


@record
class Item:
    """One file of the batch: what the ad asked for and what will be run for it."""

    ad: FileAd
    local_path: str = ""
    protocol: str = ""
    url: Optional[Url] = None
    credential: Optional[str] = None
    op: Optional[Transfer] = None
    problem: Optional[TransferError] = None


def available_methods(wanted: Optional[str] = None) -> List[str]:
    """Served schemes whose backend module is installed, optionally limited to ``wanted``.

    ``wanted`` is a comma/space list (an administrator's choice); unknown names are ignored.
    Nothing is imported, so the ``-classad`` query stays fast and silent.
    """
    allowed = {w.strip().lower() for w in (wanted or "").replace(",", " ").split()} or set(SERVED)
    return [s for s in SERVED if s in allowed and importlib.util.find_spec(schemes.SCHEMES[s].module) is not None]


def split_credential(url_text: str) -> Tuple[Optional[str], str, str]:
    """``'tok.h+https://x/y'`` -> ``('tok.h', 'https', 'https://x/y')``; no prefix -> None."""
    scheme, sep, rest = url_text.partition("://")
    if not sep:
        return None, "", url_text
    credential, plus, base = scheme.rpartition("+")
    return (credential if plus else None), base.lower(), f"{base.lower()}://{rest}"


def site_label_of(url: Url) -> Optional[str]:
    """``s3://USER@SITE/...`` -> ``SITE`` (selects ``PEGASUS_CREDENTIALS_<SITE>``)."""
    if url.scheme in schemes.S3 and "@" in url.host:
        return url.host.rpartition("@")[2].split(":", 1)[0] or None
    return None


def build_items(ads: Sequence[FileAd], upload: bool, env: Mapping[str, str], sandbox: str,
                methods: Sequence[str]) -> List[Item]:
    """One :class:`Item` per file ad; unusable ones carry ``problem`` and no ``op``."""
    return [_item(ad, upload, env, sandbox, methods) for ad in ads]


def _item(ad: FileAd, upload: bool, env: Mapping[str, str], sandbox: str, methods: Sequence[str]) -> Item:
    credential, scheme, bare = split_credential(ad.url)
    item = Item(ad, os.path.join(sandbox, ad.local), scheme or "unknown", credential=credential)
    try:
        if ad.problem:
            raise InvalidInput(ad.problem, operation="parse")
        if scheme not in methods:
            raise InvalidInput(f"URL scheme '{scheme or ad.url}' is not served by this plugin "
                               f"(it serves {', '.join(methods)})", operation="parse")
        if credential and scheme not in schemes.HTTP:
            raise InvalidInput(f"a credential prefix ('{credential}+') is supported for http and https "
                               "URLs only", operation="parse")
        parsed = parse_url(bare, env=env)
        if scheme in schemes.HTTP:
            _check_port(bare)
        if credential:
            item.url = TokenUrl(parsed.scheme, parsed.host, parsed.path, None, credential)
        else:
            item.url = Url(parsed.scheme, parsed.host, parsed.path, site_label_of(parsed))
        _require_backend(scheme)
    except TransferError as err:
        item.problem = err
        return item
    local = Url("file", "", item.local_path)
    item.op = Transfer((local,), item.url) if upload else Transfer((item.url,), local)
    return item


def _check_port(url_text: str) -> None:
    """InvalidInput for an http(s) URL whose port is not a number in 0-65535 (the connection
    layer would otherwise fail on it as an internal error, after counting an attempt)."""
    try:
        urlsplit(url_text).port
    except ValueError as err:
        raise InvalidInput(f"malformed URL: {err}", operation="parse") from None


def _require_backend(scheme: str) -> None:
    """InvalidInput when the backend serving ``scheme`` cannot be imported on this node."""
    name = schemes.SCHEMES[scheme].module
    try:
        importlib.import_module(name)
    except ImportError as err:
        raise InvalidInput(f"the {scheme} backend is not installed on this execute node ({err})",
                           operation="resolve") from err


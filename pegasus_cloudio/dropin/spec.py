"""The transfer specification pegasus-transfer reads: v1 text or Pegasus 5 JSON.

Input starting with exactly ``# src`` is v1 (4-line groups of ``# src N SITE`` / URL /
``# dst N SITE`` / URL); anything else is a JSON array of ``transfer``, ``mkdir`` and
``remove`` objects. Unknown keys (``id``, ``attributes``, ``checkpoint``...) are ignored.
Mixed lists and several mkdirs are accepted (the 5.1.3 tool crashes on them).

Sources and destinations are ordered by ``priority`` (read as the stock ``int(priority)``:
``1.5`` is 1), highest first; entries without one keep their input order after those that
have one (5.1.3 draws a random priority, so its order is random). Only the first destination
is used, as in 5.1.3.
"""

from __future__ import annotations

from transfer import backends
from transfer.errors import InvalidInput
from transfer.lean import record
from transfer.ops import LinkMode, Mkdir, Remove, Transfer
from transfer.urls import parse_url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional, Tuple

    from transfer.ops import Operation
    from transfer.urls import Url

_TRUE = {"yes", "true", "t", "1"}
_FALSE = {"no", "false", "f", "0"}


class SpecError(InvalidInput):
    """The transfer specification cannot be parsed; the message names the entry or field."""


@record(frozen=True)
class Entry:
    """One item of the specification, as an operation plus what Pegasus attached to it.

    ``raw`` is the JSON object (v1 pairs are converted) so that entries this tool does not
    serve natively can be handed to the stock pegasus-transfer unchanged.
    """

    op: Operation
    raw: Dict[str, Any]
    lfn: Optional[str] = None
    linkage: Optional[str] = None
    generate_checksum: bool = False
    verify_checksum_remote: bool = False

    @property
    def native(self) -> bool:
        """True when every URL of the entry has a native backend."""
        return all(backends.supports(url.scheme) for url in urls_of(self.op))


def urls_of(op: Operation) -> Tuple[Url, ...]:
    if isinstance(op, Transfer):
        return op.sources + (op.dest,)
    return (op.target,)


def parse_spec(text: str, *, symlink: bool = False, env: Optional[Mapping[str, str]] = None) -> List[Entry]:
    """Parse v1 or JSON; ``symlink`` (``-s``) turns local-to-local copies into symlinks."""
    if text[0:5] == "# src":
        return parse_v1(text, symlink=symlink, env=env)
    try:
        data = _loads(text)
    except ValueError as err:
        raise SpecError(f"Error parsing the transfer specification JSON: {err}",
                        operation="parse") from None
    except RecursionError:
        raise SpecError("Error parsing the transfer specification JSON: nested too deeply",
                        operation="parse") from None
    if not isinstance(data, list):
        raise SpecError("Error parsing the transfer specification JSON: top level is not a list",
                        operation="parse")
    return [_entry(item, index, symlink, env) for index, item in enumerate(data)]


def parse_v1(text: str, *, symlink: bool = False, env: Optional[Mapping[str, str]] = None) -> List[Entry]:
    """The legacy format; a missing site label on the first pair is an error, later ones reuse it."""
    lines = [line.rstrip("\r\n") for line in text.splitlines() if len(line.strip()) > 4]
    entries: List[Entry] = []
    label: Optional[str] = None
    src: Optional[Tuple[str, Optional[str]]] = None
    for number, line in enumerate(lines, 1):
        if line.startswith("#"):
            label = _v1_label(line)
            if label is None:  # as stock: never the previous pair's site (and its credentials)
                raise SpecError(f"line {number}: unable to parse comment {line[:80]!r} (expected '# src|dst N SITE')",
                                operation="parse")
            continue
        if label is None:
            raise SpecError(f"line {number}: URL before any '# src/dst N SITE' comment", operation="parse")
        if src is None:
            src = (line.strip(), label)
            continue
        raw = {"type": "transfer", "src_urls": [{"site_label": src[1], "url": src[0]}],
               "dest_urls": [{"site_label": label, "url": line.strip()}]}
        entries.append(_entry(raw, len(entries), symlink, env))
        src = None
    if src is not None:
        raise SpecError(f"source URL {src[0]} has no destination", operation="parse")
    return entries


def _entry(item: Any, index: int, symlink: bool, env: Optional[Mapping[str, str]]) -> Entry:
    if not isinstance(item, dict):
        raise SpecError(f"Unknown JSON entry: {item!r}", operation="parse")
    kind = item.get("type")
    if kind == "transfer":
        return _transfer(item, index, symlink, env)
    if kind == "mkdir":
        return Entry(Mkdir(_url(_field(item, "target", index), index, env)), item)
    if kind == "remove":
        target = _field(item, "target", index)
        if not isinstance(target, dict):
            raise SpecError(f"entry {index} (remove): 'target' must be an object", operation="parse")
        recursive = _bool(target.get("recursive", item.get("recursive", False)), "recursive", index)
        return Entry(Remove(_url(target, index, env), recursive), item)
    import json
    raise SpecError(f"Unknown JSON entry: {json.dumps(item)[:200]}", operation="parse")


def _transfer(item: Dict[str, Any], index: int, symlink: bool, env: Optional[Mapping[str, str]]) -> Entry:
    sources = _field(item, "src_urls", index)
    dests = _field(item, "dest_urls", index)
    if not isinstance(sources, list) or not sources or not isinstance(dests, list) or not dests:
        raise SpecError(f"entry {index}: src_urls and dest_urls must be non-empty lists", operation="parse")
    src_urls = _ranked(sources, "src_urls", index, env)
    dest = _ranked(dests, "dest_urls", index, env)[0]
    lfn, linkage = _text(item, "lfn", index), _text(item, "linkage", index)
    verify = _bool(item.get("verify_checksum_remote", False), "verify_checksum_remote", index)
    if verify and not lfn:  # stock copies, then fails every attempt: the .meta files are keyed by LFN
        raise SpecError(f"entry {index}: verify_checksum_remote needs an 'lfn'", operation="parse")
    local_pair = dest.scheme == "file" and all([u.scheme == "file" for u in src_urls])
    return Entry(
        Transfer(src_urls, dest, lfn=lfn,
                 link=LinkMode.SYMLINK if symlink and local_pair else LinkMode.COPY,
                 verify_source=_bool(item.get("verify_symlink_source", True), "verify_symlink_source", index)),
        item,
        lfn=lfn,
        linkage=linkage,
        generate_checksum=_bool(item.get("generate_checksum", False), "generate_checksum", index),
        verify_checksum_remote=verify,
    )


def _field(item: Dict[str, Any], name: str, index: int) -> Any:
    if name not in item:
        raise SpecError(f"entry {index} ({item.get('type')}): missing '{name}'", operation="parse")
    return item[name]


def _text(item: Dict[str, Any], name: str, index: int) -> Optional[str]:
    """An optional string field (``lfn``, ``linkage``): the integrity and monitoring records
    quote it as text."""
    value = item.get(name)
    if value is not None and not isinstance(value, str):
        raise SpecError(f"entry {index}: '{name}' must be a string, got {value!r:.80}", operation="parse")
    return value


def _url(entry: Any, index: int, env: Optional[Mapping[str, str]]) -> Url:
    if not isinstance(entry, dict) or "url" not in entry or "site_label" not in entry:
        raise SpecError(f"entry {index}: a URL entry needs 'site_label' and 'url'", operation="parse")
    label, text = entry["site_label"], entry["url"]
    if not isinstance(text, str):
        raise SpecError(f"entry {index}: 'url' must be a string, got {text!r:.80}", operation="parse")
    if label is not None and not isinstance(label, str):
        raise SpecError(f"entry {index}: 'site_label' must be a string, got {label!r:.80}", operation="parse")
    try:
        return parse_url(text, site_label=label.replace("-", "_") if label else None, env=env)
    except InvalidInput as err:
        raise SpecError(f"entry {index}: {err.message}", url=err.url, operation="parse") from None


def _ranked(entries: List[Any], field: str, index: int, env: Optional[Mapping[str, str]]) -> Tuple[Url, ...]:
    """The URLs of ``entries``, highest ``priority`` first (stock sorts destinations too, and uses
    the first); every priority is checked, even of a lone entry."""
    priorities = [_priority(entry, field, n, index) for n, entry in enumerate(entries)]
    if len(entries) == 1:  # the usual entry: nothing to rank
        return (_url(entries[0], index, env),)
    ranked = sorted(range(len(entries)), key=lambda n: (-priorities[n], n))
    return tuple([_url(entries[n], index, env) for n in ranked])


def _priority(entry: Any, field: str, position: int, index: int) -> int:
    """The stock tool's ``int(entry["priority"])``: a bool, a whole number, a finite float (1.5 is
    1, truncated) or a string of a whole number (``"90"``, ``" 7 "``); anything else (``null``,
    ``"1.5"``, NaN, a list) stops the stock run, and is a SpecError naming the entry here.
    An entry without the key ranks after every entry with one (stock draws a random one)."""
    if not isinstance(entry, dict) or "priority" not in entry:
        return -1
    value = entry["priority"]
    try:
        if isinstance(value, (bool, int, float, str)):
            return int(value)
    except (ValueError, OverflowError):
        pass
    raise SpecError(f"entry {index}: {field}[{position}] priority {value!r:.80} is not a whole number",
                    operation="parse")


def _bool(value: Any, name: str, index: int) -> bool:
    if isinstance(value, bool):
        return value
    if not isinstance(value, (str, int)):
        raise SpecError(f"entry {index}: '{name}' must be a boolean, got {value!r:.80}", operation="parse")
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise SpecError(f"entry {index}: '{name}' must be a boolean, got {value!r}", operation="parse")


def _v1_label(line: str) -> Optional[str]:
    """The SITE of a ``# src N SITE`` line (``^# +\\w+ +\\w+ +([\\w-]+)``), or None."""
    rest = line[1:]
    for extra in ("", "", "-"):
        word = rest.lstrip(" ")
        if len(word) == len(rest):
            return None  # at least one space before each word
        length = 0
        for char in word:
            if not (char.isalnum() or char == "_" or char in extra):
                break
            length += 1
        if not length:
            return None
        rest = word[length:]
    return word[:length]


def _loads(text: str) -> Any:
    """``json.loads(text)`` without importing ``json`` unless the text does not parse
    (:mod:`transfer.lean_json`)."""
    from transfer.lean_json import loads
    return loads(text)

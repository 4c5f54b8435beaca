"""S3's XML answers parsed by expat itself, without :mod:`xml.etree.ElementTree`.

A listing (a concat job's stage-in lists its inputs' directory) or an error body is the only
XML a job step reads, and ``import xml.etree.ElementTree`` costs about 17 ms of CPU (it
brings ``re``, ``copy``, ``weakref``, ``contextlib``); ``pyexpat``, the parser ElementTree
drives, costs about 3. :func:`parse` builds the little tree the S3 code reads, with
ElementTree's meaning for what it offers:

* a :class:`Node` has ``tag`` (the local name: a namespace URI or prefix is dropped, as the
  S3 code did after ElementTree), ``text`` (ElementTree's ``text``: the character data
  before its first child, but ``""`` rather than None when there is none) and ``children``;
* ``findtext(tag, default=None)``: the text of the first child named ``tag``, else
  ``default``; ``iter(tag=None)``: the node and its descendants in document order, those
  named ``tag`` only when given.

Malformed XML raises :class:`XmlError` with expat's message (line and column), and so does
a document type declaration: S3 sends none, and refusing it keeps entity expansion (and
external entities) out of reach of a hostile server.
"""

from __future__ import annotations

import pyexpat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterator, List, Optional

__all__ = ["Node", "XmlError", "parse"]


class XmlError(ValueError):
    """The bytes are not well-formed XML."""


class Node:
    __slots__ = ("tag", "text", "children", "_pieces")

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.text = ""
        self.children: "List[Node]" = []
        self._pieces: "List[str]" = []

    def findtext(self, tag: str, default: "Optional[str]" = None) -> "Optional[str]":
        for child in self.children:
            if child.tag == tag:
                return child.text
        return default

    def iter(self, tag: "Optional[str]" = None) -> "Iterator[Node]":
        stack = [self]
        while stack:
            node = stack.pop()
            if tag is None or node.tag == tag:
                yield node
            stack.extend(reversed(node.children))


def parse(data: bytes) -> Node:
    """The document element of ``data`` (see the module docstring)."""
    parser = pyexpat.ParserCreate(namespace_separator=" ")
    parser.buffer_text = True
    top = Node("")
    path = [top]

    def start(name: str, attributes: object) -> None:
        node = Node(name.rpartition(" ")[2])
        path[-1].children.append(node)
        path.append(node)

    def end(name: str) -> None:
        node = path.pop()
        node.text = "".join(node._pieces)
        node._pieces = []

    def characters(text: str) -> None:
        node = path[-1]
        if not node.children:  # after a child it is that child's tail, which nothing reads
            node._pieces.append(text)

    def doctype(*declaration: object) -> None:
        raise XmlError("a document type declaration (S3 answers have none)")

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = characters
    parser.StartDoctypeDeclHandler = doctype
    try:
        parser.Parse(data, True)
    except pyexpat.ExpatError as err:
        raise XmlError(str(err)) from None
    if not top.children:
        raise XmlError("no element found")
    return top.children[0]

"""transfer.backends._s3_xml against xml.etree.ElementTree: the same tags (namespaces
dropped), texts, findtext and iter answers on random S3-like documents, and both refuse the
same malformed ones."""

from __future__ import annotations

import random
import subprocess
import sys
import xml.etree.ElementTree as ET
from typing import List, Optional

import pytest

from transfer.backends._s3_xml import Node, XmlError, parse

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
TAGS = ["Contents", "Key", "Size", "ETag", "LastModified", "CommonPrefixes", "Prefix", "Error", "Code", "Message"]
TEXTS = ["", "a", "dir/f 1.dat", "&amp;", "&lt;x&gt;", "&#233;t&#xe9;", "&quot;etag&quot;", "  spaced  ", "é€😀",
         "<![CDATA[a<b&c]]>", "line\nbreak", "2026-11-26T05:00:00.000Z", "300"]


def _element(rng: random.Random, depth: int) -> str:
    tag = rng.choice(TAGS)
    if depth > 3 or rng.random() < 0.5:
        return f"<{tag}>{rng.choice(TEXTS)}</{tag}>" if rng.random() < 0.9 else f"<{tag}/>"
    inner = "".join(_element(rng, depth + 1) + rng.choice(["", "\n  ", " "]) for _ in range(rng.randrange(4)))
    return f"<{tag}>{rng.choice(['', chr(10)])}{inner}</{tag}>"


def _document(rng: random.Random) -> bytes:
    root = rng.choice(["ListBucketResult", "Error", "DeleteResult", "ListAllMyBucketsResult"])
    namespace = rng.choice(["", f' xmlns="{NS}"', f' xmlns:s3="{NS}"'])
    body = "".join(_element(rng, 1) for _ in range(rng.randrange(6)))
    if "xmlns:s3" in namespace:
        body = body.replace("<", "<s3:").replace("<s3:/", "</s3:").replace("<s3:![CDATA[", "<![CDATA[")
        root_open, root_close = f"<s3:{root}{namespace}>", f"</s3:{root}>"
    else:
        root_open, root_close = f"<{root}{namespace}>", f"</{root}>"
    head = rng.choice(['<?xml version="1.0" encoding="UTF-8"?>\n', ""])
    return (head + root_open + body + root_close).encode()


def _local(tag: str) -> str:
    return tag.split("}", 1)[1] if "}" in tag else tag


def _shape(node: Node) -> List[object]:
    return [(n.tag, n.text, [c.tag for c in n.children],
             {t: n.findtext(t) for t in TAGS}) for n in node.iter()]


def _et_shape(element: ET.Element) -> List[object]:
    def findtext(e: ET.Element, tag: str) -> Optional[str]:
        for child in e:
            if _local(child.tag) == tag:
                return child.text or ""
        return None
    return [(_local(e.tag), e.text or "", [_local(c.tag) for c in e],
             {t: findtext(e, t) for t in TAGS}) for e in element.iter()]


@pytest.mark.parametrize("seed", range(6))
def test_trees_match_elementtree_on_random_documents(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        data = _document(rng)
        assert _shape(parse(data)) == _et_shape(ET.fromstring(data)), data
        tag = rng.choice(TAGS)
        assert [n.text for n in parse(data).iter(tag) if not n.children] == \
            [e.text or "" for e in ET.fromstring(data).iter() if _local(e.tag) == tag and len(e) == 0]


@pytest.mark.parametrize("data", [b"", b"<a>", b"<a></b>", b"<a>&bogus;</a>", b"<a><b></a>", b"not xml",
                                  b"<a>x</a><b/>", b"<s3:a>unbound prefix</s3:a>", b"\xff\xfe<a/>",
                                  b'<!DOCTYPE a [<!ENTITY e SYSTEM "file:///etc/passwd">]><a>&e;</a>'])
def test_what_elementtree_refuses_is_refused(data: bytes) -> None:
    with pytest.raises(ET.ParseError):
        ET.fromstring(data)
    with pytest.raises(XmlError):
        parse(data)


@pytest.mark.parametrize("data", [
    b'<!DOCTYPE a [<!ENTITY e "x">]><a>&e;</a>',
    b'<!DOCTYPE a [<!ENTITY a "aaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">]><a>&b;</a>',
    b'<!DOCTYPE a SYSTEM "http://example.invalid/a.dtd"><a/>'])
def test_a_document_type_declaration_is_refused_before_any_entity_is_expanded(data: bytes) -> None:
    with pytest.raises(XmlError, match="document type"):
        parse(data)


def test_a_listing_parse_does_not_import_elementtree() -> None:
    code = ("import sys; from transfer.backends._s3_wire import xml_tree; "
            "r = xml_tree(b'<ListBucketResult><Contents><Key>k</Key></Contents></ListBucketResult>'); "
            "print(r.findtext('Contents'), [c.findtext('Key') for c in r.iter('Contents')], "
            "'xml.etree.ElementTree' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["['k']", "False"], done.stdout + done.stderr

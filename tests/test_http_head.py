"""What our HTTP/1.1 client puts on the wire: exactly one Host, and no field that could split
a line (RFC 7230 section 5.4 tells servers to answer two Hosts with 400; a CR/LF in a value
would let a caller smuggle a header or a second request)."""

import pytest

from pegasus_cloudio_testbed.scripted import Reply, ScriptedServer
from transfer.credentials import Credentials, S3SiteConfig
from transfer.backends.s3 import S3Backend
from transfer.config import Settings
from transfer.errors import InvalidInput
from transfer.http.pool import ConnectionPool
from transfer.urls import Url


@pytest.fixture
def server():
    with ScriptedServer(lambda req: Reply(200, {"ETag": '"x"'}, b"ok")) as srv:
        yield srv


def _get(pool, headers):
    with pool.request("GET", "/k", headers) as response:
        return response.read()


def test_default_host_is_the_endpoint(server):
    pool = ConnectionPool(server.endpoint, max_idle=1)
    _get(pool, [])
    assert server.requests[0].all("host") == [f"127.0.0.1:{server.port}"]


def test_a_callers_host_replaces_the_default_exactly_once(server):
    pool = ConnectionPool(server.endpoint, max_idle=1)
    _get(pool, [("host", "bucket.example.org"), ("X-A", "1")])
    request = server.requests[0]
    assert request.all("host") == ["bucket.example.org"]
    assert request.raw_head.lower().count(b"\nhost:") == 1


def test_two_host_headers_are_refused(server):
    pool = ConnectionPool(server.endpoint, max_idle=1)
    with pytest.raises(InvalidInput, match="more than one Host"):
        _get(pool, [("Host", "a"), ("HOST", "b")])
    assert server.requests == []


@pytest.mark.parametrize("headers,named", [
    ([("X-Meta", "a\r\nX-Evil: 1")], "X-Meta"),
    ([("X-Meta", "a\nb")], "X-Meta"),
    ([("X-Meta", "a\rb")], "X-Meta"),
    ([("X-Meta", "a\0b")], "X-Meta"),
    ([("X-Ok", "1"), ("X-Bad\r\nName", "v")], "X-Bad"),
    ([("Host", "a\r\nb")], "Host"),
])
def test_cr_lf_nul_in_a_header_is_refused_naming_it_and_nothing_is_sent(server, headers, named):
    pool = ConnectionPool(server.endpoint, max_idle=1)
    with pytest.raises(InvalidInput) as info:
        _get(pool, headers)
    message = str(info.value)
    assert named in message and "\n" not in message and "CR, LF or NUL" in message
    assert "X-Evil: 1" not in message  # values are not echoed: they may be secrets
    assert server.requests == []
    assert _get(pool, []) == b"ok"  # the refused request left the pool usable
    assert len(server.requests) == 1


def test_a_request_target_with_a_line_break_or_space_is_refused(server):
    pool = ConnectionPool(server.endpoint, max_idle=1)
    for target in ("/a b", "/a\r\nX: y"):
        with pytest.raises(InvalidInput, match="request line"):
            with pool.request("GET", target, []):
                pass
    assert server.requests == []


def test_virtual_hosted_s3_sends_one_host_naming_the_bucket(server):
    """The bug this file exists for: both the endpoint's and the bucket's Host went out."""
    pool = ConnectionPool("http://s3.us-west-2.amazonaws.com", max_idle=1,
                          connect_to=("127.0.0.1", server.port))
    config = S3SiteConfig("http://s3.us-west-2.amazonaws.com", "us-west-2", Credentials("AK", "SK"))
    backend = S3Backend(pool, config, "us-west-2", Settings())
    backend.stat(Url("s3", "bkt", "/some/key"))
    request = server.requests[0]
    assert request.all("host") == ["bkt.s3.us-west-2.amazonaws.com"]
    assert request.target == "/some/key"

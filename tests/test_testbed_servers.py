"""The test bed's servers and files: TLS files, MinIO over http and https (and behind the TCP
proxy), the stock Pegasus tools against it, free ports."""

from __future__ import annotations

import configparser
import ipaddress
import json
import os
import socket
import ssl
import stat
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

import boto3
import pytest
from botocore.config import Config
from cryptography import x509

from pegasus_cloudio_testbed.certs import make_tls_files
from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.ports import free_port
from pegasus_cloudio_testbed.proxy import Fault, TcpProxy
from pegasus_cloudio_testbed.stock import make_stock_home


def test_tls_files_are_private_and_name_loopback(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path / "tls")
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    assert cert.issuer == ca.subject and cert.issuer != cert.subject


def _s3_client(server: MinioServer, endpoint: Optional[str] = None) -> Any:
    return boto3.client(
        "s3", endpoint_url=endpoint or server.endpoint, region_name="us-east-1",
        aws_access_key_id=server.access_key, aws_secret_access_key=server.secret_key,
        verify=str(server.ca_file) if server.ca_file else None,
        config=Config(retries={"mode": "standard", "max_attempts": 3}),
    )


def test_minio_over_http_serves_s3_and_writes_credentials(minio: MinioServer, tmp_path: Path) -> None:
    assert minio.endpoint == f"http://127.0.0.1:{minio.port}" and minio.ca_file is None
    with urllib.request.urlopen(minio.endpoint + "/minio/health/cluster", timeout=5) as answer:
        assert answer.status == 200
    s3 = _s3_client(minio)
    s3.create_bucket(Bucket="testbed-http")
    s3.put_object(Bucket="testbed-http", Key="k", Body=b"hello")
    assert s3.get_object(Bucket="testbed-http", Key="k")["Body"].read() == b"hello"

    path = minio.write_pegasus_credentials(tmp_path / "creds.conf", endpoint="http://127.0.0.1:1")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    ini = configparser.ConfigParser()
    ini.read(path)
    assert ini["minio"]["endpoint"] == "http://127.0.0.1:1"
    assert dict(ini["test@minio"]) == {"access_key": minio.access_key, "secret_key": minio.secret_key}


def test_minio_over_https_is_verified_against_the_generated_ca(minio_tls: MinioServer) -> None:
    assert minio_tls.endpoint == f"https://127.0.0.1:{minio_tls.port}"
    assert minio_tls.ca_file is not None
    trusted = ssl.create_default_context(cafile=str(minio_tls.ca_file))
    url = minio_tls.endpoint + "/minio/health/cluster"
    with urllib.request.urlopen(url, timeout=5, context=trusted) as answer:
        assert answer.status == 200
    with pytest.raises(urllib.error.URLError) as refused:
        urllib.request.urlopen(url, timeout=5, context=ssl.create_default_context())
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)
    s3 = _s3_client(minio_tls)
    s3.create_bucket(Bucket="testbed-https")
    assert s3.list_objects_v2(Bucket="testbed-https")["KeyCount"] == 0


def test_minio_start_failure_raises_with_the_log(tmp_path: Path) -> None:
    fake = tmp_path / "minio"
    fake.write_text("#!/bin/sh\necho 'FATAL something broke' >&2\nexit 1\n")
    fake.chmod(0o755)
    server = MinioServer(binary=fake, start_timeout=5)
    with pytest.raises(RuntimeError, match="something broke"):
        server.start()
    assert server.log_file is None  # stopped and cleaned up


def test_proxy_in_front_of_minio_counts_sdk_requests_and_slowdown_is_retried(
        minio: MinioServer) -> None:
    with TcpProxy((minio.host, minio.port)) as relay:
        s3 = _s3_client(minio, endpoint=relay.url())
        s3.create_bucket(Bucket="testbed-proxy")
        relay.reset_counters()
        body = os.urandom(3 << 20)  # large enough for Expect: 100-continue
        s3.put_object(Bucket="testbed-proxy", Key="big", Body=body)
        assert relay.requests_by_method == {"PUT": 1}
        relay.set_faults([Fault.status(503, method="GET")])
        assert s3.get_object(Bucket="testbed-proxy", Key="big")["Body"].read() == body
        assert relay.requests_by_method == {"PUT": 1, "GET": 2}
        relay.set_faults([Fault.status(503, method="PUT")])
        s3.put_object(Bucket="testbed-proxy", Key="big2", Body=body)  # 503 before the body
        assert relay.requests_by_method["PUT"] == 3
        assert relay.bytes_up >= 2 * len(body)



def test_stock_pegasus_transfer_copies_files_and_downloads_from_minio(
        minio: MinioServer, tmp_path: Path) -> None:
    _s3_client(minio).create_bucket(Bucket="testbed-stock")
    _s3_client(minio).put_object(Bucket="testbed-stock", Key="dir/obj.txt", Body=b"from minio\n")
    stock = make_stock_home(tmp_path / "home")
    assert os.access(stock.transfer, os.X_OK) and stock.home == (tmp_path / "home").resolve()
    (tmp_path / "src.txt").write_text("local\n")
    entries = [
        {"type": "transfer", "lfn": "a", "id": 1,
         "src_urls": [{"site_label": "local", "url": f"file://{tmp_path}/src.txt"}],
         "dest_urls": [{"site_label": "local", "url": f"file://{tmp_path}/out/a.txt"}]},
        {"type": "transfer", "lfn": "b", "id": 2,
         "src_urls": [{"site_label": "minio", "url": "s3://test@minio/testbed-stock/dir/obj.txt"}],
         "dest_urls": [{"site_label": "local", "url": f"file://{tmp_path}/out/b.txt"}]},
    ]
    env = stock.env(os.environ)
    assert env["PATH"].split(os.pathsep)[0] == str(stock.bin_dir)
    env["PEGASUS_CREDENTIALS"] = str(minio.write_pegasus_credentials(tmp_path / "creds.conf"))
    done = subprocess.run([str(stock.transfer), "--threads", "1"], input=json.dumps(entries),
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"Path: {stock.s3}" in done.stderr  # helper found via PEGASUS_HOME/bin
    assert (tmp_path / "out/a.txt").read_text() == "local\n"
    assert (tmp_path / "out/b.txt").read_text() == "from minio\n"


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))

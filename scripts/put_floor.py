"""Stage-out wall of small files: the floor a client could reach, against ours and s5cmd.

    .venv/bin/python scripts/put_floor.py [--count 6173] [--rounds 2] [--connections 5]

On one embedded MinIO, alternating in each round: a *floor* client (raw sockets, one thread per
connection, SigV4-signed PUTs written in one ``sendall`` each and answers read with nothing but
the status line checked: what no real client can undercut on the same connections), ours
(``python -m pegasus_cloudio.dropin --threads N``, node cache off) and ``s5cmd cp`` with its
defaults. Prints, per contestant, the wall time and MinIO's CPU per object. If the floor's wall
is above 0.7x of s5cmd's, no client with N connections meets issue 24's stage-out target on
this server and machine: the server's time per PUT is the bound. A development measurement
beside ``pegasus-cloudio bench small-files``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pegasus_cloudio_bench.harness import tool_env  # noqa: E402
from pegasus_cloudio_testbed.minio import MinioServer  # noqa: E402
from pegasus_cloudio_testbed.tools import ensure_s5cmd  # noqa: E402
from transfer._digests import sha256_hex  # noqa: E402
from transfer.backends._sigv4 import SigV4Signer  # noqa: E402
from transfer.credentials import Credentials  # noqa: E402

BUCKET = "floor"
SITE = "minio"


def _request(signer: SigV4Signer, host: str, path: str, body: bytes) -> bytes:
    headers = signer.sign("PUT", host, path, payload_hash=sha256_hex(body))
    lines = [f"PUT {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _answer(sock: socket.socket, buf: bytes) -> bytes:
    """Read one answer (status 200 required); return what followed it."""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            raise SystemExit("MinIO closed a connection")
        buf += data
    head, _, rest = buf.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"PUT refused: {head.splitlines()[0]!r}")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        rest += sock.recv(65536)
    return rest[length:]


def _floor_connection(server: MinioServer, signer: SigV4Signer, paths: List[str], body: bytes) -> None:
    host = f"{server.host}:{server.port}"
    with socket.create_connection((server.host, server.port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        for path in paths:
            sock.sendall(_request(signer, host, path, body))
            buf = _answer(sock, buf)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=6173)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=5)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="put-floor-")
    src = os.path.join(root, "src")
    os.makedirs(src)
    names = [f"f{i:05d}" for i in range(args.count)]
    body = os.urandom(300)
    for name in names:
        with open(os.path.join(src, name), "wb") as fh:
            fh.write(body)
    with MinioServer() as server:
        signer = SigV4Signer(Credentials(server.access_key, server.secret_key), "us-east-1")
        _floor_connection(server, signer, [f"/{BUCKET}"], b"")
        creds = server.write_pegasus_credentials(os.path.join(root, "credentials.conf"), site=SITE, user="bench",
                                                 endpoint=server.endpoint)
        env = tool_env({"PEGASUS_CREDENTIALS": str(creds), "PEGASUS_CLOUDIO_CONFIG": os.devnull,
                        "PEGASUS_CLOUDIO_CACHE_DIR": "off", "AWS_EC2_METADATA_DISABLED": "true"})
        s5env = dict(env, AWS_ACCESS_KEY_ID=server.access_key, AWS_SECRET_ACCESS_KEY=server.secret_key,
                     AWS_REGION="us-east-1")
        s5cmd = str(ensure_s5cmd())
        walls: Dict[str, List[float]] = {}
        minio: Dict[str, List[float]] = {}

        def floor(prefix: str) -> None:
            paths = [f"/{BUCKET}/{prefix}/{name}" for name in names]
            threads = [threading.Thread(target=_floor_connection, args=(server, signer, paths[k::args.connections], body))
                       for k in range(args.connections)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

        def ours(prefix: str) -> None:
            spec = [{"type": "transfer", "linkage": "output", "lfn": n, "id": 1,
                     "src_urls": [{"site_label": "local", "url": f"file://{src}/{n}"}],
                     "dest_urls": [{"site_label": SITE, "url": f"s3://bench@{SITE}/{BUCKET}/{prefix}/{n}"}]}
                    for n in names]
            subprocess.run([sys.executable, "-m", "pegasus_cloudio.dropin", "--threads", str(args.connections)],
                           input=json.dumps(spec).encode(), env=env, check=True, stderr=subprocess.DEVNULL)

        def s5(prefix: str) -> None:
            subprocess.run([s5cmd, "--endpoint-url", server.endpoint, "cp", f"{src}/*", f"s3://{BUCKET}/{prefix}/"],
                           env=s5env, check=True, stdout=subprocess.DEVNULL)

        contestants: Dict[str, Callable[[str], None]] = {"floor": floor, "ours": ours, "s5cmd": s5}
        for round_no in range(args.rounds):
            for label, run in contestants.items():
                before, start = server.cpu_s(), time.monotonic()
                run(f"{label}{round_no}")
                walls.setdefault(label, []).append(time.monotonic() - start)
                minio.setdefault(label, []).append((server.cpu_s() - before) / args.count * 1e3)
                print(f"round {round_no} {label:6}: wall {walls[label][-1]:6.2f} s, MinIO CPU "
                      f"{minio[label][-1]:.2f} ms per object, load {os.getloadavg()[0]:.1f}", flush=True)
    s5_wall = statistics.median(walls["s5cmd"])
    for label in contestants:
        wall = statistics.median(walls[label])
        print(f"{label:6} median wall {wall:6.2f} s ({wall / s5_wall:.2f}x s5cmd's), "
              f"MinIO CPU {statistics.median(minio[label]):.2f} ms per object")


if __name__ == "__main__":
    main()

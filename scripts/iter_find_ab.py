"""``Client.iter_find`` over many keys on a test-bed MinIO: time to the first page and memory.

    AWS_EC2_METADATA_DISABLED=true PYTHONPATH=.:bench .venv/bin/python scripts/iter_find_ab.py \
        [--keys 100000] [--rounds 5] [--firsts 4] [--threads 8] [--json FILE]

Issue 33's target: "``iter_find`` over 100,000 keys: first page in under one round trip plus one
page's parse, and memory flat". One MinIO (``pegasus_cloudio_testbed.minio``), ``--keys`` objects
of 64 B under one prefix, stored by one ``Client.copy`` of a single local file (the engine's
pipelined PUTs). Then, ``--rounds`` times, on warm connections, medians reported:

- ``bare``: one ListObjectsV2 of 1,000 keys through our S3 router: ``request_s`` (send to the
  last byte read) and ``parse_s`` (our XML parser and the page's ``ObjectInfo``s);
- for ``iter_find``, obstore's ``list`` (``chunk_size=1000``), boto3's ``list_objects_v2``
  paginator, and ``find`` (the whole list): ``first_s`` (call to first item in hand; ``find``:
  the whole list), ``total_s`` and ``keys_per_s``; ``first_s`` is the median of ``--firsts``
  first pages alone per round (the rest never asked for), each after a ``bare`` request;

then once per contestant, items consumed and dropped, tracemalloc's peak of Python memory above
the start: after the first page, after 10 pages and at the end (flat: the end's peak is the first
page's). tracemalloc does not see obstore's Rust buffers, only the Python objects it hands out.
``target_met``: ``iter_find``'s ``first_s`` <= ``bare`` ``request_s + parse_s`` (medians).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from typing import Any, Callable, Dict, Iterable, Iterator, List, Sequence, Tuple

os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

from pegasus_cloudio_testbed.minio import MinioServer  # noqa: E402
from transfer.backends._s3_listing import page_objects  # noqa: E402
from transfer.backends._s3_route import check_reply  # noqa: E402
from transfer.backends._s3_wire import S3Path, xml_tree  # noqa: E402
from transfer.backends._sigv4 import EMPTY_SHA256  # noqa: E402
from transfer.backends._wire_common import canonical_query  # noqa: E402
from transfer.client import Client  # noqa: E402

BUCKET, PREFIX = "iterfind", "many"
Pages = Callable[[], Iterator[Sequence[Any]]]


def upload(client: Client, keys: int) -> float:
    """Store ``keys`` objects of 64 B under ``PREFIX/``; the seconds it took."""
    client.mkdir(f"s3://{BUCKET}")
    with tempfile.NamedTemporaryFile(suffix=".bin") as local:
        local.write(os.urandom(64))
        local.flush()
        started = time.monotonic()
        client.copy((local.name, f"s3://{BUCKET}/{PREFIX}/k{i:07d}") for i in range(keys))
        return time.monotonic() - started


def bare_page(client: Client) -> Tuple[float, float, int]:
    """(request_s, parse_s, keys) of one ListObjectsV2 of the first 1,000 keys."""
    url = client.url(f"s3://{BUCKET}/{PREFIX}")
    router = client.session.backend(url)._router  # type: ignore[attr-defined]
    query = canonical_query({"list-type": "2", "prefix": PREFIX + "/", "encoding-type": "url"})
    started = time.perf_counter()
    with router.send("GET", S3Path(BUCKET, ""), query, [], None, EMPTY_SHA256, str(url)) as response:
        check_reply(response, str(url), "list")
        body = response.read()
    read = time.perf_counter()
    found = list(page_objects(url, xml_tree(body)))
    return read - started, time.perf_counter() - read, len(found)


def contestants(client: Client, endpoint: str, key: str, secret: str) -> Dict[str, Pages]:
    """Each lister as a function returning an iterator of pages (the first request sent when
    the first page is asked for, as each library does)."""
    url = f"s3://{BUCKET}/{PREFIX}"
    found: Dict[str, Pages] = {"iter_find": lambda: client.iter_find(url),
                               "find": lambda: iter([client.find(url)])}
    try:
        import obstore
        from obstore.store import S3Store
        store = S3Store(BUCKET, endpoint=endpoint, access_key_id=key, secret_access_key=secret,
                        region="us-east-1", virtual_hosted_style_request=False,
                        client_options={"allow_http": True})
        found["obstore"] = lambda: iter(obstore.list(store, PREFIX + "/", chunk_size=1000))
    except ImportError:
        pass
    try:
        import boto3  # type: ignore[import-untyped]
        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key, aws_secret_access_key=secret,
                          region_name="us-east-1")
        paginator = s3.get_paginator("list_objects_v2")
        found["boto3"] = lambda: (page.get("Contents", []) for page in
                                  paginator.paginate(Bucket=BUCKET, Prefix=PREFIX + "/"))
    except ImportError:
        pass
    return found


def timed(pages: Pages) -> Tuple[float, float, int]:
    """(first_s, total_s, items) of one whole iteration."""
    started = time.perf_counter()
    iterator = pages()
    first = next(iterator)
    first_s = time.perf_counter() - started
    items = len(first)
    del first
    for page in iterator:
        items += len(page)
    return first_s, time.perf_counter() - started, items


def first_page(pages: Pages) -> float:
    """Seconds from the call to the first page in hand (the rest never asked for)."""
    started = time.perf_counter()
    next(pages())
    return time.perf_counter() - started


def memory(pages: Pages) -> Dict[str, float]:
    """Peak traced KiB above the start after the first page, after 10 and at the end, each
    page dropped once counted."""
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    marks: Dict[str, float] = {}
    count = 0
    for count, page in enumerate(pages(), 1):
        del page
        if count in (1, 10):
            marks[f"peak_kib_page_{count}"] = (tracemalloc.get_traced_memory()[1] - base) / 1024
    marks["peak_kib_end"] = (tracemalloc.get_traced_memory()[1] - base) / 1024
    marks["pages"] = count
    tracemalloc.stop()
    return {name: round(value, 1) for name, value in marks.items()}


def median(rows: Iterable[float]) -> float:
    return statistics.median(list(rows))


def run(args: argparse.Namespace) -> Dict[str, Any]:
    load = [os.getloadavg()]
    report: Dict[str, Any] = {"keys": args.keys, "rounds": args.rounds}
    with MinioServer() as s3, Client(endpoint_url=s3.endpoint, key=s3.access_key, secret=s3.secret_key,
                                     threads=args.threads) as client:
        report["upload_s"] = round(upload(client, args.keys), 1)
        load.append(os.getloadavg())
        listers = contestants(client, s3.endpoint, s3.access_key, s3.secret_key)
        for pages in listers.values():  # warm: connections, imports, MinIO's listing cache
            timed(pages)
        bare: List[Tuple[float, float, int]] = []
        runs: Dict[str, List[Tuple[float, float, int]]] = {name: [] for name in listers}
        firsts: Dict[str, List[float]] = {name: [] for name in listers if name != "find"}
        for _ in range(args.rounds):
            for name, pages in listers.items():
                runs[name].append(timed(pages))
            for _ in range(args.firsts):  # the first page alone, interleaved with the bare request
                bare.append(bare_page(client))
                for name in firsts:
                    firsts[name].append(first_page(listers[name]))
        report["bare"] = {"request_s": round(median(r[0] for r in bare), 5),
                          "parse_s": round(median(r[1] for r in bare), 5), "keys": bare[0][2],
                          "samples": len(bare)}
        for name, rows in runs.items():
            assert all(r[2] == args.keys for r in rows), (name, [r[2] for r in rows])
            total = median(r[1] for r in rows)
            first = median(firsts.get(name) or [r[0] for r in rows])
            report[name] = {"first_s": round(first, 5), "total_s": round(total, 3),
                            "keys_per_s": round(args.keys / total)}
        for name, pages in listers.items():
            report[name].update(memory(pages))
    load.append(os.getloadavg())
    bound = report["bare"]["request_s"] + report["bare"]["parse_s"]
    report["target_met"] = report["iter_find"]["first_s"] <= bound
    report["first_over_bound"] = round(report["iter_find"]["first_s"] / bound, 2)
    report["load_average"] = {"start": load[0], "after_upload": load[1], "end": load[2],
                              "cpus": os.cpu_count()}
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--firsts", type=int, default=4, help="first pages alone per round")
    parser.add_argument("--threads", type=int, default=8, help="the upload's threads")
    parser.add_argument("--json", help="also write the report to this file")
    args = parser.parse_args()
    report = run(args)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

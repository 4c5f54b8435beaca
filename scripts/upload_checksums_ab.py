"""S3 single-PUT uploads (issue 33: the full-object CRC32 sent with each), two interpreters
with two source trees, interleaved, on one MinIO; then the upload body's CPU in this tree.

    .venv/bin/python scripts/upload_checksums_ab.py BEFORE_PYTHON AFTER_PYTHON

Each is a Python whose ``import transfer`` is the tree to measure (``/work/main/.venv/bin/python``
and ``.venv/bin/python``; run ``BEFORE_PYTHON AFTER_PYTHON`` twice as the same to see the noise).
For 2,000 x 300 B and 60 x 4 MiB, 8 threads through ``Client.write_bytes``: the best of three
rounds of wall time and of the whole process's CPU (user + system). Then ``file_body`` (MD5)
against ``file_body_crc32`` (MD5 + CRC32, one read) per body, the best of three, in this process."""
import json, os, resource, subprocess, sys, time, uuid
from pegasus_cloudio_testbed.minio import MinioServer

CHILD = r'''
import os, sys, time, concurrent.futures as cf
from transfer.client import Client
ep, ak, sk, bucket, size, n = sys.argv[1:7]
size, n = int(size), int(n)
data = os.urandom(size)
with Client(endpoint_url=ep, key=ak, secret=sk, env={"AWS_EC2_METADATA_DISABLED": "true"}) as c:
    c.mkdir(f"s3://{bucket}")
    with cf.ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda i: c.write_bytes(f"s3://{bucket}/k{i}", data), range(n)))
'''

def run(py, s3, size, n):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([py, "-c", CHILD, s3.endpoint, s3.access_key, s3.secret_key, f"ab-{uuid.uuid4().hex[:10]}",
                    str(size), str(n)], check=True, cwd="/tmp", env={**os.environ, "PYTHONPATH": ""})
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

def bodies() -> None:
    import tempfile
    from transfer.http.connection import file_body, file_body_crc32
    where = tempfile.mkdtemp()
    for size in (300, 64 << 10, 1 << 20, 8 << 20):
        path = os.path.join(where, f"f{size}")
        with open(path, "wb") as fh:
            fh.write(os.urandom(size))
        n = max(20, min(20000, (200 << 20) // size))
        best = {}
        for _ in range(3):
            for name, fn in (("md5", file_body), ("md5+crc32", file_body_crc32)):
                t = time.process_time()
                for _ in range(n):
                    fn(path)
                best[name] = min(best.get(name, 1e9), (time.process_time() - t) / n)
        print(f"body of {size} B: md5 {best['md5'] * 1e6:.1f} us, md5+crc32 {best['md5+crc32'] * 1e6:.1f} us "
              f"({best['md5+crc32'] / best['md5']:.2f}x)")


before_py, after_py = sys.argv[1:3]
print("load", os.getloadavg())
with MinioServer() as s3:
    for size, n in ((300, 2000), (4 << 20, 60)):
        res = {"before": [], "after": []}
        for rnd in range(3):
            for name, py in (("before", before_py), ("after", after_py)) if rnd % 2 == 0 else (("after", after_py), ("before", before_py)):
                res[name].append(run(py, s3, size, n))
        bw, bc = min(w for w, _ in res["after"]), min(c for _, c in res["after"])
        mw, mc = min(w for w, _ in res["before"]), min(c for _, c in res["before"])
        print(f"{n} x {size} B, 8 threads: wall before {mw:.2f}s after {bw:.2f}s ({bw/mw:.2f}x); "
              f"process CPU before {mc:.2f}s after {bc:.2f}s ({bc/mc:.2f}x)  [best of 3, interleaved]")
print("load", os.getloadavg())
bodies()

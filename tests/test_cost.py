"""`pegasus-cloudio cost`: requests and dollars from the transfer-attempt records tools write."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pegasus_cloudio.cost.prices import DEFAULT_TABLES, load_tables
from pegasus_cloudio.cost.records import job_type, parse_attempts, usage_of
from pegasus_cloudio_bench.small_files import transfer_spec

RECORD = '''- transfer_attempts:
  - src_url: "s3://u@minio/b/a \\"q\\".dat"
    src_label: "minio"
    dst_url: "file:///job/a.dat"
    dst_label: "local"
    success: False
    start: 1700000000
    duration: 0.1
    lfn: "a.dat"
  - src_url: "file:///job/out.dat"
    src_label: "local"
    dst_url: "s3://u@minio/b/out.dat"
    dst_label: "minio"
    success: True
    start: 1700000001
    duration: 0.2
    bytes: 1000
some other output
'''


def test_records_parse_quoted_urls_count_failed_attempts_and_name_job_types() -> None:
    attempts = list(parse_attempts("kickstart text\n" + RECORD))
    assert [a.src_url for a in attempts] == ['s3://u@minio/b/a "q".dat', "file:///job/out.dat"]
    usage = usage_of(attempts)["minio"]
    assert (usage.class_a, usage.class_b, usage.failed, usage.bytes_up) == (1, 1, 1, 1000)
    assert job_type("/s/00/00/project_ID0000001.out.000") == "project"
    assert job_type("stage_in_remote_minio_0_0.out.001") == "stage_in_remote_minio"


def test_2010_prices_reproduce_the_seed_rates() -> None:
    old = DEFAULT_TABLES["s3-2010"]
    assert old.cost(1000, 0, 0) == pytest.approx(0.01)    # $0.01 per 1,000 PUTs
    assert old.cost(0, 10000, 0) == pytest.approx(0.01)   # $0.01 per 10,000 GETs


def test_price_file_errors_name_the_file_and_entry(tmp_path: Path) -> None:
    bad = tmp_path / "prices.json"
    bad.write_text(json.dumps([{"name": "x", "date": "2025", "source": "s", "class_a_per_1000": -1,
                                "class_b_per_1000": 0}]))
    with pytest.raises(ValueError, match="prices.json: entry 0 \\(x\\)"):
        load_tables(str(bad))
    done = subprocess.run([sys.executable, "-m", "pegasus_cloudio.cli", "cost", str(tmp_path), "--prices", str(bad)],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "prices.json: entry 0" in done.stderr and done.stderr.count("\n") == 1


def _run(argv, spec, env, multipart: Path) -> None:
    multipart.mkdir(parents=True, exist_ok=True)
    # the node cache off: a cache hit is a recorded download that makes no request
    done = subprocess.run(argv, input=spec, env={**os.environ, **env, "PEGASUS_MULTIPART_DIR": str(multipart),
                                                 "PEGASUS_CLOUDIO_CACHE_DIR": "off"},
                          capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]


def test_cost_of_a_submit_dir_matches_the_requests_counted_at_the_store(proxied, bucket, tmp_path: Path) -> None:
    proxy, env = proxied
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}").write_bytes(b"x" * 500)
    url = f"s3://test@minio/{bucket}"
    ours = [sys.executable, "-m", "pegasus_cloudio.dropin", "--threads", "2"]
    submit = tmp_path / "submit" / "00" / "00"
    proxy.reset_counters()
    _run(ours, transfer_spec([(f"file://{src}/f{i}", f"{url}/f{i}") for i in range(3)], "local", "minio"),
         env, tmp_path / "mp-out")
    _run(ours, transfer_spec([(f"{url}/f{i}", f"file://{tmp_path}/g{i}") for i in range(3)], "minio", "local"),
         env, tmp_path / "mp-in")
    counted = proxy.requests_by_method
    submit.mkdir(parents=True)
    for name, folder in (("project_ID0000001.out.000", "mp-out"), ("stage_in_remote_minio_0_0.out.000", "mp-in")):
        (submit / name).write_text("kickstart output\n" + "".join(p.read_text() for p in (tmp_path / folder).iterdir()))
    done = subprocess.run([sys.executable, "-m", "pegasus_cloudio.cli", "cost", str(tmp_path / "submit"), "--json"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    rows = {(r["site"], r["job_type"]): r for r in result["rows"]}
    assert rows[("minio", "project")]["class_a"] == 3 == counted["PUT"]
    assert rows[("minio", "stage_in_remote_minio")]["class_b"] == 3 == counted["GET"]
    assert rows[("minio", "project")]["bytes_up"] == 1500
    assert result["total_usd"]["s3-2010"] == pytest.approx(3 * 0.01 / 1000 + 3 * 0.01 / 10000)
    table = subprocess.run([sys.executable, "-m", "pegasus_cloudio.cli", "cost", str(tmp_path / "submit")],
                           capture_output=True, text=True)
    assert "prices s3-2010" in table.stdout and "stage_in_remote_minio" in table.stdout

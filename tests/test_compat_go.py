"""Three tools, one input: our drop-in, the Python pegasus-transfer Pegasus 5 ships (5.1.3 worker
wheel) and Pegasus's Go pegasus-transfer (commit b261f8c80, the stock tool to come, built by
pegasus_cloudio_testbed.tools). Each test runs all three on the same input in twin directories
and compares exit codes, files, transfer-attempt records, integrity output and error texts;
where the two stock tools differ, the test says which one we follow (docs/dropin.md, "The Go
pegasus-transfer"). Pegasus's own test/core/016-pegasus-transfer inputs (tests/data/pegasus-016)
run pointed at MinIO and at this test's directory."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Sequence, Tuple

import boto3
import pytest

from pegasus_cloudio_testbed.minio import MinioServer
from pegasus_cloudio_testbed.stock import make_stock_home
from pegasus_cloudio_testbed.tools import ensure_go_transfer

OURS = [sys.executable, "-m", "pegasus_cloudio.dropin"]
DATA = Path(__file__).parent / "data" / "pegasus-016"
Env = Dict[str, str]


@dataclass(frozen=True)
class Tool:
    argv: Sequence[str]
    env: Callable[[Env], Env]


@dataclass(frozen=True)
class Run:
    rc: int
    out: str
    err: str
    work: Path


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Tool]:
    stock = make_stock_home(tmp_path_factory.mktemp("stock"))
    go = ensure_go_transfer()
    return {"ours": Tool(OURS, dict), "python": Tool([str(stock.transfer)], stock.env),
            "go": Tool([str(go)], lambda env: dict(env, AWS_EC2_METADATA_DISABLED="true"))}


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PEGASUS_CLOUDIO_CONFIG": os.devnull}


def run_all(tools: Mapping[str, Tool], spec: Callable[[Path], str], env: Env, tmp_path: Path, name: str,
            flags: Sequence[str] = ("-m", "1")) -> Dict[str, Run]:
    """Each tool on ``spec(work)`` in its own ``work`` directory (also its cwd; ``{work}`` in a
    value of ``env`` names it)."""
    runs = {}
    for label, tool in tools.items():
        work = tmp_path / f"{name}-{label}"
        work.mkdir()
        own = {k: v.replace("{work}", str(work)) for k, v in env.items()}
        done = subprocess.run([*tool.argv, *flags], input=spec(work), env=tool.env(own), cwd=work,
                              capture_output=True, text=True, timeout=300)
        runs[label] = Run(done.returncode, done.stdout, done.stderr, work)
    return runs


def tree(directory: Path) -> Dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def transfer(src: str, dst: str, src_label: str = "local", dst_label: str = "local", **extra: object) -> dict:
    return {"type": "transfer", "lfn": os.path.basename(dst), "id": 1,
            "src_urls": [{"site_label": src_label, "url": src}],
            "dest_urls": [{"site_label": dst_label, "url": dst}], **extra}


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    src = tmp_path / "inputs"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.txt").write_bytes(f"file {i}\n".encode() * (i + 1))
    return src


def codes(runs: Mapping[str, Run]) -> Dict[str, int]:
    return {label: run.rc for label, run in runs.items()}


def files(runs: Mapping[str, Run], skip: str = "") -> Dict[str, Dict[str, bytes]]:
    """Each run's files, minus those under ``skip`` (a directory the tools write records into)."""
    return {label: {k: v for k, v in tree(run.work).items() if not (skip and k.startswith(skip))}
            for label, run in runs.items()}


def test_local_copies_give_the_same_files_and_attempt_records(tools: Dict[str, Tool], inputs: Path, env: Env,
                                                              tmp_path: Path) -> None:
    """The records monitord reads (PEGASUS_MULTIPART_DIR) agree line for line but for times."""
    def spec(w: Path) -> str:
        (w / "mp").mkdir()
        return json.dumps([transfer(f"file://{inputs}/f{i}.txt", f"file://{w}/out/f{i}.txt") for i in range(3)])

    runs = run_all(tools, spec, dict(env, PEGASUS_MULTIPART_DIR="{work}/mp"), tmp_path, "copy")
    assert codes(runs) == {"ours": 0, "python": 0, "go": 0}, {k: r.err for k, r in runs.items()}
    found = files(runs, skip="mp/")
    assert found["ours"] == found["python"] == found["go"] == {f"out/f{i}.txt": (inputs / f"f{i}.txt").read_bytes()
                                                               for i in range(3)}
    records = {}
    for label, run in runs.items():
        [name] = os.listdir(run.work / "mp")
        text = (run.work / "mp" / name).read_text().replace(str(run.work), "WORK")
        records[label] = sorted(line for line in text.splitlines() if not re.match(r"\s+(start|duration):", line))
    assert records["ours"] == records["python"] == records["go"]
    assert records["ours"].count("    bytes: 14") == 1
    # the Stats: summary: the Python tool prints it, ours too; the Go tool keeps only the records
    stats = {label: [line for line in (run.out + run.err).splitlines() if "Stats: Total 3 transfers" in line]
             for label, run in runs.items()}
    assert len(stats["ours"]) == len(stats["python"]) == 1 and stats["go"] == []


def test_integrity_records_agree_but_for_the_times_and_the_inode(tools: Dict[str, Tool], inputs: Path, env: Env,
                                                                 tmp_path: Path) -> None:
    """generate_checksum on a stage-in writes pegasus-integrity's entry (KICKSTART_INTEGRITY_DATA)."""
    def spec(w: Path) -> str:
        return json.dumps([transfer(f"file://{inputs}/f2.txt", f"file://{w}/f2.txt", generate_checksum=True)])

    entries = {}
    for label, tool in tools.items():
        kid = tmp_path / f"{label}.yaml"
        runs = run_all({label: tool}, spec, dict(env, KICKSTART_INTEGRITY_DATA=str(kid)), tmp_path, "kid")
        assert runs[label].rc == 0, runs[label].err
        text = kid.read_text().replace(str(runs[label].work), "WORK")
        entries[label] = [line for line in text.splitlines()
                          if not re.match(r"\s+(inode|mtime|atime|ctime|checksum_timing):", line)]
    assert entries["ours"] == entries["python"] == entries["go"]
    assert f'      file_name: "{inputs}/f2.txt"' in entries["ours"]  # the local source, checksummed before
    assert "      sha256: " + hashlib.sha256((inputs / "f2.txt").read_bytes()).hexdigest() in entries["ours"]


def test_a_missing_source_fails_alike_and_the_other_files_arrive(tools: Dict[str, Tool], inputs: Path, env: Env,
                                                                 tmp_path: Path) -> None:
    def spec(w: Path) -> str:
        return json.dumps([transfer(f"file://{inputs}/absent.txt", f"file://{w}/out/absent.txt"),
                           transfer(f"file://{inputs}/f0.txt", f"file://{w}/out/f0.txt")])

    runs = run_all(tools, spec, env, tmp_path, "missing")
    assert codes(runs) == {"ours": 1, "python": 1, "go": 1}
    found = files(runs)
    assert found["ours"] == found["python"] == {"out/f0.txt": b"file 0\n"}
    # With the Go tool, whether f0 arrives after the failed copy varies from run to run (about half
    # the runs on this machine, 2026-12-02); it never delivers anything else. We follow the Python tool.
    assert found["go"] in ({}, {"out/f0.txt": b"file 0\n"})
    for label in runs:  # every tool ends with the same summary
        assert "Some transfers failed!" in runs[label].err, (label, runs[label].err)
    # ours and the Python tool name the file; the Go tool does not (we follow the Python tool)
    assert f"{inputs}/absent.txt" in runs["ours"].err and f"{inputs}/absent.txt" in runs["python"].err
    assert "absent.txt" not in runs["go"].err


def test_malformed_json_fails_alike(tools: Dict[str, Tool], env: Env, tmp_path: Path) -> None:
    runs = run_all(tools, lambda w: "[{not json", env, tmp_path, "badjson")
    assert codes(runs) == {"ours": 1, "python": 1, "go": 1}
    assert all(tree(run.work) == {} for run in runs.values())
    assert "Error parsing the transfer specification JSON" in runs["ours"].err
    assert "Error parsing the transfer specification JSON" in runs["python"].err
    assert "error parsing the transfer specification JSON" in runs["go"].err


def test_v1_text_input_is_read_by_ours_and_python_and_refused_by_go(tools: Dict[str, Tool], inputs: Path, env: Env,
                                                                    tmp_path: Path) -> None:
    """The Go tool dropped the v1 format; we keep it, as the Python tool (docs/dropin.md)."""
    runs = run_all(tools, lambda w: f"# src 1 local\nfile://{inputs}/f1.txt\n# dst 1 local\nfile://{w}/v1/f1.txt\n",
                   env, tmp_path, "v1")
    assert codes(runs) == {"ours": 0, "python": 0, "go": 1}
    found = files(runs)
    assert found["ours"] == found["python"] == {"v1/f1.txt": b"file 1\nfile 1\n"} and found["go"] == {}
    assert "error parsing the transfer specification JSON" in runs["go"].err


def test_an_unknown_flag_is_a_usage_error_alike(tools: Dict[str, Tool], env: Env) -> None:
    rcs = {label: subprocess.run([*tool.argv, "--no-such-flag"], env=tool.env(env), capture_output=True,
                                 timeout=60).returncode for label, tool in tools.items()}
    assert rcs == {"ours": 2, "python": 2, "go": 2}


# --- Pegasus's own test/core/016-pegasus-transfer inputs, pointed at the test bed ---------------


def pegasus_016(name: str, bucket: str, work: Path) -> str:
    """``name`` with its store at ``bucket`` on MinIO (site ``amazon``), its local paths under
    ``work``, and its GridFTP hosts at 127.0.0.1 (no packet leaves this machine)."""
    text = (DATA / name).read_text()
    for old, new in (("test@amazon/pegasus-isi-transfer-tests", f"test@amazon/{bucket}"),
                     ("/lfs1/pegasus-transfer-testing", str(work)), ("/opt/pegasus-transfer-testing", str(work)),
                     ("obelix.isi.edu", "127.0.0.1"), ("workflow.isi.edu", "127.0.0.1")):
        text = text.replace(old, new)
    return text


ORIGINALS = ("many-small-files/filesave.png", "many-small-files/gtk-media-play-ltr.png",
             "many-small-files/multimedia-volume-control.svg", "medium-files/a.txt", "medium-files/b.txt")


@pytest.fixture
def amazon_env(minio: MinioServer, env: Env, tmp_path: Path) -> Env:
    creds = minio.write_pegasus_credentials(tmp_path / "credentials.conf", site="amazon", user="test")
    return dict(env, PEGASUS_CREDENTIALS=str(creds), AWS_EC2_METADATA_DISABLED="true")


def s3_client(minio: MinioServer):  # type: ignore[no-untyped-def]
    return boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                        aws_secret_access_key=minio.secret_key, region_name="us-east-1")


def keys(minio: MinioServer, bucket: str) -> Dict[str, bytes]:
    client = s3_client(minio)
    listed = client.list_objects_v2(Bucket=bucket).get("Contents", [])
    return {o["Key"]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed}


def originals(work: Path) -> Dict[str, bytes]:
    made = {}
    for rel in ORIGINALS:
        path = work / "originals" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rel.encode() * 50)
        made[rel] = path.read_bytes()
    return made


def test_016_s3_steps_give_the_same_objects_and_files(tools: Dict[str, Tool], minio: MinioServer, amazon_env: Env,
                                                      tmp_path: Path) -> None:
    """s3-step1.in (a source and a destination line per pair, the format before v1's ``# src``
    lines) is refused by all three, before anything is written; with its five objects put in
    place, s3-step2.in downloads one and copies one object twice, by s3:// and by s3s://."""
    client = s3_client(minio)
    step1, step2 = {}, {}
    for label, tool in tools.items():
        bucket = f"p016-{label}"
        client.create_bucket(Bucket=bucket)
        work = tmp_path / f"016-{label}"
        work.mkdir()
        content = originals(work)
        for step, results in (("s3-step1.in", step1), ("s3-step2.in", step2)):
            (work / step).write_text(pegasus_016(step, bucket, work))
            done = subprocess.run([*tool.argv, "-m", "1", "-f", str(work / step)], env=tool.env(amazon_env),
                                  cwd=work, capture_output=True, text=True, timeout=300)
            results[label] = (done.returncode, done.stderr, keys(minio, bucket))
            for rel, body in content.items():  # what step 1 was written to leave
                client.put_object(Bucket=bucket, Key=rel, Body=body)
        step2[label] += (tree(work / "tmp") if (work / "tmp").is_dir() else {},)
    assert {label: (rc, objects) for label, (rc, _err, objects) in step1.items()} == {
        "ours": (1, {}), "python": (1, {}), "go": (1, {})}
    for label, (_rc, err, _objects) in step1.items():
        assert "rror parsing the transfer specification JSON" in err, (label, err)
    b, svg = content["medium-files/b.txt"], "many-small-files/multimedia-volume-control.svg"
    both = dict(content, **{"medium-files/c.txt": b, "medium-files/d.txt": b})
    assert step2["python"][0] == step2["go"][0] == 0, (step2["python"][1], step2["go"][1])
    assert step2["python"][2:] == step2["go"][2:] == (both, {svg: content[svg]})
    # s3s:// on the site's http:// endpoint: the endpoint decides, as in both stock tools, and
    # ours says once that the data goes unencrypted (docs/dropin.md)
    rc, err, objects, downloaded = step2["ours"]
    assert (rc, objects, downloaded) == (0, both, {svg: content[svg]}), err
    assert sum("s3s://" in line and "plain http" in line for line in err.splitlines()) == 1, err


@pytest.mark.parametrize("name", ["mixed-protocols.in", "v1-format-mixed-protocols.in"])
def test_016_gridftp_without_globus_fails_alike_and_writes_nothing(tools: Dict[str, Tool], minio: MinioServer,
                                                                    amazon_env: Env, tmp_path: Path,
                                                                    name: str) -> None:
    """No globus-url-copy on this machine: every tool exits 1 and no object appears."""
    client = s3_client(minio)
    results = {}
    for label, tool in tools.items():
        bucket = f"grid-{label}-{name.split('-')[0]}"
        client.create_bucket(Bucket=bucket)
        done = subprocess.run([*tool.argv, "-m", "1"], input=pegasus_016(name, bucket, tmp_path),
                              env=tool.env(amazon_env), cwd=tmp_path, capture_output=True, text=True, timeout=300)
        results[label] = (done.returncode, keys(minio, bucket))
    assert results == {label: (1, {}) for label in tools}

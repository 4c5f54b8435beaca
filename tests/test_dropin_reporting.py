"""Reporting parts of the drop-in, checked against the stock 5.1.3 worker tools.

* ``monitoring`` / ``stats``: the same inputs are fed to the stock ``Pegasus.transfer.Stats``
  object (imported from the venv's ``pegasus-wms.worker``) and to our functions; the text
  must be identical.
* ``integrity``: the real ``pegasus-integrity.py`` runs as a subprocess on the same files
  and ``*.meta`` directories; blobs are compared key by key, verdicts and messages line by
  line.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from pegasus_cloudio.dropin import integrity, monitoring, stats
from pegasus_cloudio.dropin.monitoring import AttemptRecord

import Pegasus.transfer as pt  # noqa: E402  (the real stock module, pinned in requirements)
STOCK_INTEGRITY = os.path.join(os.path.dirname(pt.__file__), "cli", "pegasus-integrity.py")
NOW = 1795343278.0
StockTransfer = Any  # Pegasus.transfer.Transfer; the stock package has no type hints


# --- helpers -------------------------------------------------------------------------


def stock_transfer(src: Tuple[str, str], dst: Tuple[str, str], lfn: str = "") -> StockTransfer:
    t = pt.Transfer()
    t.add_src(src[0], src[1], priority=1)
    t.add_dst(dst[0], dst[1], priority=1)
    t.set_lfn(lfn)
    return t


def local_size(t: StockTransfer) -> Tuple[int, bool]:
    """What Stats.add_stats measures: size of the src if file, else of the dst if file."""
    for proto, path in ((t.get_src_proto(), t._src_urls[0].path), (t.get_dst_proto(), t._dst_urls[0].path)):
        if proto == "file":
            try:
                return os.stat(path).st_size, True
            except OSError:
                return 0, True
    return 0, False


def record_for(t: StockTransfer, raw_src_label: Optional[str], raw_dst_label: Optional[str], ok: bool,
               start: float, end: float) -> AttemptRecord:
    size, local = local_size(t)
    return AttemptRecord(src_url=t.src_url(), src_label=raw_src_label, dst_url=t.dst_url(),
                         dst_label=raw_dst_label, success=ok, start=start, duration=end - start,
                         lfn=t.lfn or None, bytes=size, local_file=local)


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def stock_log() -> Iterator[ListHandler]:
    handler = ListHandler()
    logger = logging.getLogger("Pegasus")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


@pytest.fixture
def files(tmp_path: Path) -> Dict[str, Path]:
    d = tmp_path / "data"
    d.mkdir()
    out = {}
    for name, size in (("small.txt", 6), ("kilo.bin", 1024), ("k1.bin", 1300), ("mega.bin", 3 * 1024 * 1024 + 7)):
        p = d / name
        with open(p, "wb") as f:
            f.truncate(size)
        out[name] = p
    return out


def scenario(files: Dict[str, Path], tmp_path: Path) -> List[Tuple[StockTransfer, str, str, bool, float, float]]:
    """A mix of attempts: labels with '-', failed attempts, no lfn, missing local file."""
    f = {k: "file://" + str(v) for k, v in files.items()}
    missing = "file://" + str(tmp_path / "nope" / "x.txt")
    return [
        (stock_transfer(("local-site", f["small.txt"]), ("s3-stage", "s3://me@aws/b/small.txt"), "small.txt"),
         "local-site", "s3-stage", True, NOW + 0.5, NOW + 0.74),
        (stock_transfer(("local-site", f["kilo.bin"]), ("s3-stage", "s3://me@aws/b/kilo.bin"), "kilo.bin"),
         "local-site", "s3-stage", False, NOW + 1.5, NOW + 3.25),
        (stock_transfer(("s3-stage", "s3://me@aws/b//x//y"), ("condorpool", missing), "y"),
         "s3-stage", "condorpool", False, NOW + 2.49, NOW + 2.5),
        (stock_transfer(("local", f["mega.bin"]), ("local", "file://localhost" + str(tmp_path / "copy.bin"))),
         "local", "local", True, NOW + 2.5, NOW + 9.05),
        (stock_transfer(("local", "file:" + str(files["k1.bin"])), ("cp", "symlink://" + str(tmp_path / "l"))),
         "local", "cp", True, NOW + 3.0, NOW + 3.0),
    ]


# --- monitoring: transfer_attempts ---------------------------------------------------


def test_transfer_attempts_yaml_is_byte_identical_to_stock(files: Dict[str, Path], tmp_path: Path) -> None:
    s = pt.Stats()
    records = []
    for t, src_label, dst_label, ok, start, end in scenario(files, tmp_path):
        s.add_stats(t, ok, start, end)
        records.append(record_for(t, src_label, dst_label, ok, start, end))
    ours = monitoring.transfer_attempts_yaml(records)
    assert ours == "- transfer_attempts:\n" + s._yaml
    # spot checks of the stock conventions we rely on
    assert 'src_label: "local_site"' in ours and "start: 1795343278\n" in ours  # 0.5 rounds to even
    assert "    bytes: 6\n" in ours and "bytes: 1024\n" in ours  # failed attempt still has bytes
    assert ours.count("lfn:") == 3  # empty lfn omitted


def test_third_party_attempt_has_no_bytes_key(tmp_path: Path) -> None:
    t = stock_transfer(("a", "s3://u@aws/b/k"), ("b", "gs://bucket/k"), "k")
    s = pt.Stats()
    s.add_stats(t, True, NOW, NOW + 1)
    record = AttemptRecord(t.src_url(), "a", t.dst_url(), "b", True, NOW, 1.0, "k", 123, False)
    assert monitoring.transfer_attempts_yaml([record]) == "- transfer_attempts:\n" + s._yaml
    assert "bytes" not in s._yaml


def test_empty_records_give_header_only() -> None:
    assert monitoring.transfer_attempts_yaml([]) == "- transfer_attempts:\n"


def test_none_labels_and_escaping() -> None:
    record = AttemptRecord('file:///a"b\\c\nd', None, "s3://u@h/b/k\ttab", "x-y", True, NOW, 0.04,
                           'l"f', 0, True)
    text = monitoring.transfer_attempts_yaml([record])
    assert text == (
        "- transfer_attempts:\n"
        '  - src_url: "file:///a\\"b\\\\c\\x0ad"\n'
        '    src_label: ""\n'
        '    dst_url: "s3://u@h/b/k\ttab"\n'
        '    dst_label: "x_y"\n'
        "    success: True\n"
        "    start: 1795343278\n"
        "    duration: 0.0\n"
        '    lfn: "l\\"f"\n'
    )
    import yaml
    loaded = yaml.safe_load(text)
    assert loaded[0]["transfer_attempts"][0]["src_url"] == 'file:///a"b\\c\nd'


def test_yaml_parses_when_pyyaml_is_available(files: Dict[str, Path], tmp_path: Path) -> None:
    import yaml
    records = [record_for(t, a, b, ok, s, e) for t, a, b, ok, s, e in scenario(files, tmp_path)]
    loaded = yaml.safe_load(monitoring.transfer_attempts_yaml(records))
    entries = loaded[0]["transfer_attempts"]
    assert [e["success"] for e in entries] == [r.success for r in records]
    assert entries[0]["bytes"] == 6 and entries[0]["start"] == 1795343278


def test_write_matches_stock_file_and_never_overwrites(files: Dict[str, Path], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    stock_dir, our_dir = tmp_path / "stock", tmp_path / "ours"
    stock_dir.mkdir()
    our_dir.mkdir()
    s = pt.Stats()
    records = []
    for t, a, b, ok, start, end in scenario(files, tmp_path):
        s.add_stats(t, ok, start, end)
        records.append(record_for(t, a, b, ok, start, end))
    monkeypatch.setattr(time, "time", lambda: NOW)
    monkeypatch.setenv("PEGASUS_MULTIPART_DIR", str(stock_dir))
    pt.logger.disabled = True
    try:
        s.stats_summary()
    finally:
        pt.logger.disabled = False
    first = monitoring.write_transfer_attempts(str(our_dir), records)
    second = monitoring.write_transfer_attempts(str(our_dir), records[:1])
    third = monitoring.write_transfer_attempts(str(our_dir), [])
    assert os.listdir(stock_dir) == ["1795343278-transfer"]
    assert os.path.basename(first) == "1795343278-transfer"
    assert os.path.basename(second) == "1795343278-transfer-%d-1" % os.getpid()
    assert os.path.basename(third) == "1795343278-transfer-%d-2" % os.getpid()
    assert Path(first).read_bytes() == (stock_dir / "1795343278-transfer").read_bytes()
    assert Path(second).read_text() == monitoring.transfer_attempts_yaml(records[:1])
    assert sorted(os.listdir(our_dir)) == [os.path.basename(p) for p in (first, second, third)]  # no temp left
    assert oct(os.stat(first).st_mode & 0o777) == oct(os.stat(stock_dir / "1795343278-transfer").st_mode & 0o777)


def test_write_into_missing_directory_raises(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        monitoring.write_transfer_attempts(str(tmp_path / "missing"), [])


# --- monitoring: int.metric payload --------------------------------------------------


def test_payload_lines_match_stock(stock_log: ListHandler, monkeypatch: pytest.MonkeyPatch) -> None:
    s = pt.Stats()
    s.add_integrity_verify("output", 0.1234, True)
    s.add_integrity_verify("output", 0.5, False)
    s.add_integrity_verify("", 2.0, True)
    s.add_integrity_generate(None, 0.25)
    monkeypatch.setattr(time, "time", lambda: NOW)
    s.stats_summary()
    payloads = [line for line in stock_log.lines if line.startswith("@@@")]
    assert payloads == [
        monitoring.integrity_payload_line("output", 1, 1, 0.6234, ts=int(NOW)),
        monitoring.integrity_payload_line("", 1, 0, 2.0, ts=int(NOW)),
        monitoring.integrity_payload_line(None, 1, 0, 0.25, ts=int(NOW), event="compute"),
    ]
    assert payloads[0] == (
        '@@@MONITORING_PAYLOAD - START@@@{"ts": 1795343278, "monitoring_event": "int.metric", '
        '"payload": [{"event": "check", "file_type": "output", "succeeded": 1, "failed": 1, '
        '"duration": "0.623"}]}@@@MONITORING_PAYLOAD - END@@@'
    )


def test_payload_default_ts_is_now() -> None:
    before = int(time.time())
    line = monitoring.integrity_payload_line("input", 2, 0, 1.0)
    body = json.loads(line[len(monitoring.PAYLOAD_START):-len(monitoring.PAYLOAD_END)])
    assert before <= body["ts"] <= int(time.time())
    assert body["payload"][0]["duration"] == "1.000"


# --- stats ---------------------------------------------------------------------------


def stock_summary(pairs: List[Tuple[StockTransfer, bool, float, float]], seconds: float,
                  log: ListHandler) -> List[str]:
    s = pt.Stats()
    for t, ok, start, end in pairs:
        s.add_stats(t, ok, start, end)
    s._t_start_global = 1000.0
    s._t_end_global = 1000.0 + seconds
    s.stats_summary()
    return [line for line in log.lines if not line.startswith("@@@")]


@pytest.mark.parametrize("seconds", [0.4, 1.0, 12.5, 3600.0])
def test_stats_lines_match_stock(files: Dict[str, Path], tmp_path: Path, stock_log: ListHandler,
                                 seconds: float) -> None:
    items = scenario(files, tmp_path)
    items = [i for i in items if i[0].get_src_proto() == "file" or i[0].get_dst_proto() == "file"]
    expected = stock_summary([(t, ok, s, e) for t, _, _, ok, s, e in items], seconds, stock_log)
    records = [record_for(t, a, b, ok, s, e) for t, a, b, ok, s, e in items]
    ours = stats.format_stats(records, total_seconds=seconds)
    assert ours == expected
    assert ours[0].startswith("Stats: Total 5 transfers, 3.0 MB transferred in")
    assert ours[1].startswith("       Between sites local_site->s3_stage : 2 transfers, 1.0 KB")


def test_stats_third_party_and_empty_match_stock(tmp_path: Path, files: Dict[str, Path],
                                                stock_log: ListHandler) -> None:
    local = stock_transfer(("a", "file://" + str(files["small.txt"])), ("b", "s3://u@h/b/k"))
    remote = stock_transfer(("b", "s3://u@h/b/k"), ("c", "gs://bucket/k"))
    expected = stock_summary([(local, True, NOW, NOW + 1), (remote, True, NOW, NOW + 1)], 2.0, stock_log)
    ours = stats.format_stats([record_for(local, "a", "b", True, NOW, NOW + 1),
                               record_for(remote, "b", "c", True, NOW, NOW + 1)], 2.0)
    assert ours == expected == [stats.THIRD_PARTY]
    stock_log.lines.clear()
    assert stats.format_stats([]) == stock_summary([], 1.0, stock_log) == [stats.NO_TRANSFERS]


def test_stats_default_seconds_is_record_span(files: Dict[str, Path]) -> None:
    t = stock_transfer(("a", "file://" + str(files["kilo.bin"])), ("b", "s3://u@h/b/k"))
    records = [record_for(t, "a", "b", True, 100.0, 102.0), record_for(t, "a", "b", True, 101.0, 104.0)]
    assert stats.format_stats(records) == [
        "Stats: Total 2 transfers, 2.0 KB transferred in 4 seconds. Rate: 512.0 B/s (4.0 Kb/s)",
        "       Between sites a->b : 2 transfers, 2.0 KB transferred in 4 seconds. Rate: 512.0 B/s (4.0 Kb/s)",
    ]
    zero = [record_for(t, "a", "b", True, 100.0, 100.0)]
    assert stats.format_stats(zero)[0].endswith("in 0 seconds. Rate: 0.0 B/s (0.0 b/s)")


@pytest.mark.parametrize("n", [0, 1, 6, 1023, 1024, 1025, 1300.5, 1024 ** 2, 1024 ** 2 + 1, 5 * 1024 ** 3,
                               1024 ** 4 + 1, 7.3 * 1024 ** 5])
def test_iso_prefix_matches_stock(n: float) -> None:
    assert stats.iso_prefix_formatted(n) == pt.iso_prefix_formatted(n)


# --- integrity: fullstat -------------------------------------------------------------


def run_stock_integrity(args: List[str], cwd: Path, env_extra: Optional[Dict[str, str]] = None,
                        ) -> "subprocess.CompletedProcess[str]":
    env = {k: v for k, v in os.environ.items() if k not in ("KICKSTART_INTEGRITY_DATA", "PEGASUS_MULTIPART_DIR")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, STOCK_INTEGRITY] + args, cwd=str(cwd), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)


def blob_fields(text: str) -> List[Tuple[str, str]]:
    """(key, value) per line, keeping the indentation in the key."""
    out = []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        out.append((key, value))
    return out


def assert_same_blob(stock: str, ours: str) -> None:
    assert [k for k, _ in blob_fields(stock)] == [k for k, _ in blob_fields(ours)]
    unstable = {"      atime", "      checksum_timing"}
    assert [f for f in blob_fields(stock) if f[0] not in unstable] == \
        [f for f in blob_fields(ours) if f[0] not in unstable]
    assert re.search(r"^      checksum_timing: \d+\.\d{3}$", ours, re.M)
    assert re.search(r"^      atime: \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?$", ours, re.M)


@pytest.mark.parametrize("name,lfn", [("a.txt", "a.txt"), ("with space.dat", "dir/with space.dat"),
                                      ("empty", "empty")])
def test_fullstat_matches_stock(tmp_path: Path, name: str, lfn: str) -> None:
    data = tmp_path / name
    data.write_bytes(b"" if name == "empty" else b"hello world\n" * 1000)
    os.utime(data, (1700000000.25, 1700000000))  # whole-second mtime: no microseconds printed
    kid = tmp_path / "kickstart.yml"
    result = run_stock_integrity(["--generate-fullstat-yaml=%s=%s" % (lfn, data)], tmp_path,
                                 {"KICKSTART_INTEGRITY_DATA": str(kid)})
    assert result.returncode == 0, result.stdout
    stock = kid.read_text()
    ours = integrity.fullstat_yaml(lfn, str(data))
    assert_same_blob(stock, ours)
    assert "      mtime: 2023-11-14T22:13:20\n" in ours
    assert ours.startswith('    "%s":\n      comment: entry generated by pegasus-integrity\n' % lfn)
    assert "      mode: 0o100644\n" in ours or "      mode: 0o1006" in ours
    assert "      sha256: %s\n" % integrity.sha256_file(str(data)) in ours


def test_fullstat_follows_symlinks_like_stock(tmp_path: Path) -> None:
    target = tmp_path / "target.bin"
    target.write_bytes(os.urandom(3 * integrity.BLOCK_SIZE + 17))
    link = tmp_path / "link.bin"
    link.symlink_to(target)
    kid = tmp_path / "kid"
    result = run_stock_integrity(["--generate-fullstat-yaml=l=%s" % link], tmp_path,
                                 {"KICKSTART_INTEGRITY_DATA": str(kid)})
    assert result.returncode == 0, result.stdout
    assert_same_blob(kid.read_text(), integrity.fullstat_yaml("l", str(link)))


def test_append_and_stdout_match_stock(tmp_path: Path) -> None:
    data = tmp_path / "f.a"
    data.write_text("x")
    kid_stock, kid_ours = tmp_path / "stock.yml", tmp_path / "ours.yml"
    for _ in range(2):  # appends, never truncates
        assert run_stock_integrity(["--generate-fullstat-yaml=f.a=%s" % data], tmp_path,
                                   {"KICKSTART_INTEGRITY_DATA": str(kid_stock)}).returncode == 0
        integrity.append_integrity_data(integrity.fullstat_yaml("f.a", str(data)),
                                        {"KICKSTART_INTEGRITY_DATA": str(kid_ours)})
    assert_same_blob(kid_stock.read_text(), kid_ours.read_text())
    printed = run_stock_integrity(["--generate-fullstat-yaml=f.a=%s" % data], tmp_path)
    assert printed.returncode == 0
    stream = io.StringIO()
    integrity.append_integrity_data(integrity.fullstat_yaml("f.a", str(data)), {}, stream=stream)
    assert printed.stdout.endswith("\n\n") and stream.getvalue().endswith("\n\n")
    assert_same_blob(printed.stdout, stream.getvalue())


def test_fullstat_missing_file(tmp_path: Path) -> None:
    kid = tmp_path / "kid"
    result = run_stock_integrity(["--generate-fullstat-yaml=x=%s" % (tmp_path / "nope")], tmp_path,
                                 {"KICKSTART_INTEGRITY_DATA": str(kid)})
    assert result.returncode == 1 and not kid.exists()
    with pytest.raises(FileNotFoundError):
        integrity.fullstat_yaml("x", str(tmp_path / "nope"))


def test_fullstat_escapes_quotes_in_lfn(tmp_path: Path) -> None:
    data = tmp_path / "q.txt"
    data.write_text("q")
    assert integrity.fullstat_yaml('a"b', str(data)).startswith('    "a\\"b":\n')


def test_sha256_file_matches_hashlib(tmp_path: Path) -> None:
    import hashlib
    blob = os.urandom(2 * integrity.BLOCK_SIZE + 5)
    p = tmp_path / "b"
    p.write_bytes(blob)
    assert integrity.sha256_file(str(p)) == hashlib.sha256(blob).hexdigest()


# --- integrity: verify ---------------------------------------------------------------


def meta_entry(lfn: str, value: Optional[str]) -> Dict[str, Any]:
    attributes = {"user": "me", "size": "1", "checksum.type": "sha256", "checksum.timing": "0.01"}
    if value is not None:
        attributes["checksum.value"] = value
    return {"_id": lfn, "_type": "file", "_attributes": attributes}


@pytest.fixture
def meta_dir(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    for name, content in (("good.txt", "good\n"), ("bad.txt", "bad\n"), ("nosum.txt", "n\n"),
                          ("upper.txt", "u\n"), ("two.txt", "two\n")):
        (d / name).write_text(content)
    sha = {p.name: integrity.sha256_file(str(p)) for p in d.iterdir()}
    (d / "stage_in.meta").write_text(json.dumps([
        meta_entry("good.txt", sha["good.txt"]),
        meta_entry("bad.txt", "0" * 64),
        meta_entry("nosum.txt", None),
        meta_entry("upper.txt", sha["upper.txt"].upper()),
        meta_entry("two.txt", None),
        meta_entry(str(d / "good.txt"), sha["good.txt"]),
    ]))
    (d / "compute.meta").write_text(json.dumps([meta_entry("two.txt", sha["two.txt"])]))
    (d / "empty.meta").write_text("")
    (d / "emptylist.meta").write_text("[]")
    (d / "garbage.meta").write_text("this is not json")
    (d / ".hidden.meta").write_text("{\"not\": \"a list\"}")  # glob skips dot files
    return d


def stock_verify(meta_dir: Path, arg: str) -> Tuple[bool, List[str]]:
    result = run_stock_integrity(["--verify=" + arg], meta_dir)
    prefix = "Integrity check: "
    lines = [line[len(prefix):] for line in result.stdout.splitlines() if line.startswith(prefix)]
    return result.returncode == 0, [line for line in lines if not line.startswith("Error parsing the meta data")]


def normalise(lines: List[str]) -> List[str]:
    return [re.sub(r"\(timing: \d+\.\d{3}\)", "(timing: T)", line) for line in lines]


@pytest.mark.parametrize("lfn,name", [
    ("good.txt", "good.txt"),      # match
    ("bad.txt", "bad.txt"),        # mismatch
    ("nosum.txt", "nosum.txt"),    # entry without checksum.value
    ("absent.txt", "good.txt"),    # lfn in no meta file
    ("upper.txt", "upper.txt"),    # comparison is case-sensitive
    ("two.txt", "two.txt"),        # checksum only in the second of two files naming the lfn
    ("good.txt", "gone.txt"),      # file missing: mismatch against None
    ("", "good.txt"),              # no lfn: the path is the lfn
])
def test_verify_matches_stock(meta_dir: Path, lfn: str, name: str) -> None:
    path = str(meta_dir / name)
    stock_ok, stock_lines = stock_verify(meta_dir, "%s=%s" % (lfn, path) if lfn else path)
    outcome = integrity.verify_against_meta(lfn, path, str(meta_dir))
    assert outcome.ok == stock_ok
    if not stock_ok:
        assert normalise(outcome.message.split("; ")) == normalise(stock_lines)
    assert outcome.seconds >= 0
    assert outcome.notes == ("Error parsing the meta data: Expecting value: line 1 column 1 (char 0)",)


def test_verify_messages(meta_dir: Path) -> None:
    assert integrity.verify_against_meta("absent.txt", str(meta_dir / "good.txt"), str(meta_dir)).message == \
        "No checksum in the meta data for absent.txt"
    gone = integrity.verify_against_meta("good.txt", str(meta_dir / "gone.txt"), str(meta_dir))
    assert gone.message.startswith("File %s does not exist; %s: Expected checksum (" % (
        meta_dir / "gone.txt", meta_dir / "gone.txt"))
    assert "the calculated checksum (None)" in gone.message


def test_verify_with_prebuilt_index_and_cwd_default(meta_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = integrity.load_meta_index(str(meta_dir))
    assert set(index.checksums) == {"good.txt", "bad.txt", "upper.txt", "two.txt", str(meta_dir / "good.txt")}
    assert integrity.verify_against_meta("good.txt", str(meta_dir / "good.txt"), "/nonexistent", index=index).ok
    monkeypatch.chdir(meta_dir)
    assert integrity.verify_against_meta("good.txt", "good.txt").ok


def test_conflicting_entries_last_in_sorted_order_wins(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("f")
    sha = integrity.sha256_file(str(tmp_path / "f"))
    (tmp_path / "a.meta").write_text(json.dumps([meta_entry("f", "1" * 64)]))
    (tmp_path / "b.meta").write_text(json.dumps([meta_entry("f", sha)]))
    assert integrity.verify_against_meta("f", str(tmp_path / "f"), str(tmp_path)).ok
    (tmp_path / "c.meta").write_text(json.dumps([meta_entry("f", "2" * 64)]))
    assert not integrity.verify_against_meta("f", str(tmp_path / "f"), str(tmp_path)).ok


@pytest.mark.parametrize("content", ['{"x": 1}', "[1, 2]", '[{"no_id": 1}]', "null", '"abc"', "123", "true"])
def test_malformed_meta_fails_every_lfn_like_stock(tmp_path: Path, content: str) -> None:
    (tmp_path / "f").write_text("f")
    sha = integrity.sha256_file(str(tmp_path / "f"))
    (tmp_path / "a.meta").write_text(json.dumps([meta_entry("f", sha)]))
    (tmp_path / "z.meta").write_text(content)
    result = run_stock_integrity(["--verify=f=%s" % (tmp_path / "f")], tmp_path)
    assert result.returncode == 1 and "Traceback" in result.stdout
    outcome = integrity.verify_against_meta("f", str(tmp_path / "f"), str(tmp_path))
    assert not outcome.ok and outcome.message.startswith("Malformed meta data in z.meta")


def test_no_meta_files_at_all(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("f")
    ok, lines = stock_verify(tmp_path, "f=%s" % (tmp_path / "f"))
    outcome = integrity.verify_against_meta("f", str(tmp_path / "f"), str(tmp_path))
    assert (ok, lines) == (False, ["No checksum in the meta data for f"])
    assert (outcome.ok, outcome.message, outcome.notes) == (False, lines[0], ())


def test_tiny_meta_files_are_ignored_like_stock(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("f")
    sha = integrity.sha256_file(str(tmp_path / "f"))
    (tmp_path / "a.meta").write_text(json.dumps([meta_entry("f", sha)]))
    (tmp_path / "z.meta").write_text("5")  # valid JSON, but 2 bytes or fewer are never parsed
    assert stock_verify(tmp_path, "f=%s" % (tmp_path / "f")) == (True, [])
    assert integrity.verify_against_meta("f", str(tmp_path / "f"), str(tmp_path)).ok


def test_stock_writes_quotes_unescaped() -> None:
    """The documented divergence: stock output for a URL with '"' is not valid YAML."""
    t = stock_transfer(("a", 'file:///tmp/q"uote'), ("b", "s3://u@h/b/k"))
    s = pt.Stats()
    s.add_stats(t, True, NOW, NOW)
    assert '"file:///tmp/q"uote"' in s._yaml
    record = AttemptRecord(t.src_url(), "a", t.dst_url(), "b", True, NOW, 0.0, None, 0, True)
    assert '"file:///tmp/q\\"uote"' in monitoring.transfer_attempts_yaml([record])


def test_concurrent_appends_do_not_interleave(tmp_path: Path) -> None:
    import threading
    target = tmp_path / "kid"
    env = {"KICKSTART_INTEGRITY_DATA": str(target)}
    blobs = ["    \"lfn-%d\":\n%s" % (i, "      pad: %s\n" % ("x" * 5000)) for i in range(8)]

    def worker(blob: str) -> None:
        for _ in range(50):
            integrity.append_integrity_data(blob, env)

    threads = [threading.Thread(target=worker, args=(b,)) for b in blobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    text = target.read_text()
    assert len(text) == 50 * sum(len(b) for b in blobs)
    for blob in blobs:
        assert text.count(blob) == 50


def test_write_without_hard_links_still_never_overwrites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    def no_links(src: str, dst: str) -> None:
        raise OSError(errno.EPERM, "hard links not supported")

    monkeypatch.setattr(time, "time", lambda: NOW)
    monkeypatch.setattr(os, "link", no_links)
    first = monitoring.write_transfer_attempts(str(tmp_path), [])
    second = monitoring.write_transfer_attempts(str(tmp_path), [])
    assert os.path.basename(first) == "1795343278-transfer"
    assert os.path.basename(second) == "1795343278-transfer-%d-1" % os.getpid()
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(first), os.path.basename(second)]


def test_yaml_quote_escapes_exactly_the_characters_yaml_forbids():
    """The fast path (printable ASCII without a quote or backslash) and the per-character one
    give what the definition says: escape \\, ", C0/C1 controls but tab, DEL, surrogates,
    U+FFFE/U+FFFF; keep everything else (the stock bytes)."""
    import random
    from pegasus_cloudio.dropin.monitoring import yaml_quote
    forbidden = set('\\"') | set(map(chr, [*range(0x00, 0x09), *range(0x0a, 0x20), *range(0x7f, 0xa0),
                                           *range(0xd800, 0xe000), 0xfffe, 0xffff]))
    rng = random.Random(7)
    pool = [chr(i) for i in [*range(0, 0x250), *range(0xd7f0, 0xe010), 0xfffe, 0xffff, 0x1f600, 0x10ffff]]
    for _ in range(20000):
        text = "".join(rng.choice(pool) for _ in range(rng.randrange(10)))
        quoted = yaml_quote(text)
        assert quoted.startswith('"') and quoted.endswith('"')
        if not forbidden & set(text):
            assert quoted == f'"{text}"'
        else:
            assert quoted != f'"{text}"' and not forbidden - {"\\", '"'} & set(quoted)
    assert yaml_quote('a"b\\c\td\x7f\ud800') == '"a\\"b\\\\c\td\\x7f\\ud800"'

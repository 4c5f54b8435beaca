"""Stand-ins for standard modules on the job step's path, against the modules themselves: transfer.lean_json
against json (the same text out, the same values in, on random documents) and transfer.atomic.scratch_file
against tempfile.mkstemp."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import pytest

from transfer.lean_json import dumps, loads, raw_decode

ALPHABET = "abc \"\\/\n\t\x00\x1f\x7f é€😀\ud800"


def _value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(8)))
    if kind == 1:
        return rng.choice([0, -1, 1, 2 ** 64, -(2 ** 70), rng.randrange(-10 ** 9, 10 ** 9)])
    if kind == 2:
        return rng.choice([0.0, -0.0, 1.5, 1e308, 5e-324, float("inf"), float("-inf"), rng.uniform(-1e6, 1e6)])
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return float("nan")
    if kind == 5:
        return ""
    if kind == 6:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    if kind == 7:
        return tuple(_value(rng, depth + 1) for _ in range(rng.randrange(3)))
    return {"".join(rng.choice(ALPHABET) for _ in range(rng.randrange(5))): _value(rng, depth + 1)
            for _ in range(rng.randrange(5))}


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("seed", range(4))
def test_dumps_and_loads_match_json_on_random_documents(seed):
    rng = random.Random(seed)
    for _ in range(2500):
        value = _value(rng)
        for kwargs in ({}, {"sort_keys": True}, {"separators": (",", ":")}):
            text = json.dumps(value, **kwargs)
            assert dumps(value, **kwargs) == text, value
            assert _same(loads(text), json.loads(text)), text
            assert _same(loads(text.encode()), json.loads(text.encode())), text
            padded = f" \n{text}\t "
            assert _same(loads(padded), json.loads(padded))
            assert raw_decode("xx" + text + "yy", 2)[1] == 2 + len(text)


@pytest.mark.parametrize("text", ["", " ", "{", "[1,]", "{\"a\" 1}", "tru", "1 2", "\"\\x\"", "[1]]", "\ufeff[1]",
                                  "NaN x", "{\"a\":1,}", "\"\x01\""])
def test_bad_text_raises_exactly_what_json_raises(text):
    with pytest.raises(ValueError) as ours:
        loads(text)
    with pytest.raises(ValueError) as theirs:
        json.loads(text)
    assert str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError):
        raw_decode(text.strip() or "?", 0) if text.strip() in ("", "{", "tru", "[1,]") else loads(text)


def test_bytes_in_other_encodings_and_with_a_bom_go_through_json():
    for data in ('{"a": 1}'.encode("utf-16"), b"\xef\xbb\xbf[1, 2]", '"\u00e9"'.encode("utf-32")):
        assert loads(data) == json.loads(data)


def test_what_json_cannot_write_is_refused():
    for bad in ({1: "a"}, {"a": {1, 2}}, b"bytes", object()):
        with pytest.raises(TypeError):
            dumps(bad)
    nested: list = []
    for _ in range(300):
        nested = [nested]
    with pytest.raises(ValueError):
        dumps(nested)


def test_neither_json_nor_re_is_imported_on_the_good_path():
    code = ("import sys; before = set(sys.modules); from transfer.lean_json import dumps, loads; "
            "assert loads(dumps({'b': [1, 2.5, None, True, 'x\\u00e9'], 'a': {}}, sort_keys=True)) "
            "== {'a': {}, 'b': [1, 2.5, None, True, 'x\\u00e9']}; "
            "print(sorted(m for m in ('json', 'json.decoder', 're') if m in sys.modules and m not in before))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]", done.stdout
    assert "json" not in subprocess.run([sys.executable, "-c", "import sys; print(sorted(sys.modules))"],
                                        capture_output=True, text=True, timeout=60).stdout.split("'")


def test_scratch_files_are_private_new_files_in_the_temp_directory(tmp_path, monkeypatch):
    """transfer.atomic.scratch_file, tempfile.mkstemp's stand-in: $TMPDIR, 0600, never an existing name."""
    import os
    import stat

    from transfer.atomic import scratch_file

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    made = set()
    for _ in range(50):
        fd, path = scratch_file("pre-", ".pcb")
        os.close(fd)
        assert os.path.dirname(path) == str(tmp_path) and os.path.basename(path).startswith("pre-")
        assert path.endswith(".pcb") and stat.S_IMODE(os.stat(path).st_mode) == 0o600
        made.add(path)
    assert len(made) == 50
    monkeypatch.setenv("TMPDIR", str(tmp_path / "absent"))  # tempfile decides: its own fallback directory
    fd, path = scratch_file("pre-")
    os.close(fd)
    assert os.path.exists(path) and not path.startswith(str(tmp_path / "absent"))
    os.unlink(path)

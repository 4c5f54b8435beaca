"""`pegasus-cloudio bench large` gives every tool the same conditions: rounds in alternating
order, a `sync` before each timed transfer, each tool's best round kept (not a speed test)."""

import io
import os
from typing import Callable, List, Optional

import pytest

from pegasus_cloudio_bench import large
from pegasus_cloudio_bench.harness import Progress


class _Phases(Progress):
    def __init__(self) -> None:
        super().__init__(io.StringIO(), enabled=False)
        self.seen: List[str] = []

    def phase(self, text: str, moved: Optional[Callable[[], int]] = None, total: Optional[int] = None) -> "Progress":
        self.seen.append(text)
        return self


def test_tools_take_turns_in_alternating_rounds_after_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    synced: List[int] = []
    real_sync = os.sync
    monkeypatch.setattr(large.os, "sync", lambda: (synced.append(1), real_sync())[1])
    progress = _Phases()
    result = large.run(large.Params(mib=2, repeats=2), progress)
    timed = [p for p in progress.seen if "round" in p]
    order = [p.split(": ")[1].split(",")[0] for p in timed if " up: " in p]
    assert order == ["ours", "go", "s5cmd", "curl", "curl", "s5cmd", "go", "ours"]
    assert len(synced) == len(timed) == 16  # every timed transfer starts after sync
    runs = result["runs"]
    assert isinstance(runs, list) and len(runs) == 8
    for run in runs:
        assert len(run["rounds_wall_s"]) == 2 and run["wall_s"] == min(run["rounds_wall_s"]) and run["ok"]
    assert result["targets"]["downloads_identical"] is True  # type: ignore[index]
    assert set(result["ours_vs_go_throughput"]) == {"download", "upload"}  # type: ignore[arg-type]

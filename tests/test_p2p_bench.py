"""Smoke test of ``pegasus-cloudio bench p2p`` at a tiny size: every row is produced, the
table prints, and peers cut store requests (no timing is asserted)."""

from __future__ import annotations

from pegasus_cloudio_bench import p2p
from pegasus_cloudio_bench.harness import Progress


def test_bench_p2p_reports_every_row():
    params = p2p.Params(nodes=3, shared_files=6, shared_kib=8, batch=50, lookup_batches=2, sizes="300,20000",
                        repeats=1, images_per_node=2, image_kib=16, store_rtt_ms=2.0, peer_rtt_ms=0.2)
    result = p2p.run(params, Progress(enabled=False))
    plain, peers = result["shared_reads"]
    assert plain["store_requests_per_file"] == 3.0  # every node reads every file from the store
    assert peers["store_requests_per_file"] <= 1.05
    assert [r["size"] for r in result["fetch_ms"]] == [300, 20000]
    assert result["lookups"]["lookups_per_s"] > 0 and result["lookups"]["batch"] == 50
    without, with_peers = result["montage"]
    assert with_peers["store_requests"] < without["store_requests"]
    table = p2p.format_table(result)
    assert "store_requests_per_file_at_most_1.05: met" in table and "Montage-like" in table

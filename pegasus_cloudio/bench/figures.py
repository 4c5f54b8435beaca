"""The report's figures: each one a PNG made with matplotlib and the JSON of what it plots.

Every function takes a scenario's result (the dict its ``run`` returns) and returns the
figures it drew as ``(name, caption, data)``; `save` writes ``NAME.png`` and ``NAME.json``.
Published numbers from the seed papers are drawn in grey and labelled "published".
matplotlib is imported only here, with the non-interactive Agg backend.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Tuple

Figure = Tuple[str, str, Dict[str, Any]]
PUBLISHED = "0.55"  # grey


def _pyplot() -> Any:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(folder: str, name: str, fig: Any, data: Dict[str, Any]) -> Tuple[str, str]:
    """Write ``folder/name.png`` and ``folder/name.json``; return both paths."""
    os.makedirs(folder, exist_ok=True)
    png, js = os.path.join(folder, f"{name}.png"), os.path.join(folder, f"{name}.json")
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    _pyplot().close(fig)
    with open(js, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, default=str)
    return png, js


TOOL_COLORS = {"ours": "C0", "go": "C2"}  # every other tool (stock, s5cmd, curl) in C1


def workflow(result: Dict[str, Any], folder: str) -> List[Figure]:
    plt = _pyplot()
    runs = result["runs"]
    computes = sorted({r["compute_s"] for r in runs})
    modes = [m for m in ("stock", "go", "per-file", "bundles+cache", "stager", "vm-local")
             if any(r["mode"] == m for r in runs)]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(modes))
    data: Dict[str, Any] = {"makespan_s": {}, "published": {"seed 002, cloud storage vs VM storage": 4.0}}
    data["lower_bounds_not_charted"] = {}
    for i, mode in enumerate(modes):
        found = [next((r for r in runs if r["mode"] == mode and r["compute_s"] == c), None) for c in computes]
        bounds = {str(c): r["makespan_s"] for c, r in zip(computes, found)
                  if r is not None and r.get("makespan_lower_bound", r["extrapolated"])}
        values = [float("nan") if r is None or str(c) in bounds else r["makespan_s"] for c, r in zip(computes, found)]
        data["makespan_s"][mode] = {str(c): v for c, v in zip(computes, values) if v == v}
        if bounds:  # a lower bound is not a figure: named beside the chart, never drawn as a bar
            data["lower_bounds_not_charted"][mode] = bounds
        ax.bar([x + i * width for x in range(len(computes))], values, width,
               label=mode + (f" (not drawn at {', '.join(bounds)} s: lower bound)" if bounds else ""))
    ax.set_yscale("log")
    ax.set_xticks([x + width * (len(modes) - 1) / 2 for x in range(len(computes))])
    ax.set_xticklabels([f"compute {c:g} s/job" for c in computes])
    ax.set_ylabel("makespan, s (log)")
    p = result["params"]
    ax.set_title(f"Montage-like DAG, {p['producers'] + 1} jobs, {p['slots']} slots/{p['nodes']} nodes, "
                 f"{p['cores']} cores, rtt {p['rtt_ms']:g} ms", fontsize=9)
    ax.legend(fontsize=8)
    save(folder, "workflow_makespan", fig, data)
    ratios = {k: v for k, v in result["ratios"].items() if v is not None and "_vs_vm_local_at_" in k}
    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = [k.replace("_vs_vm_local_at_", " @ ") for k in ratios] + ["published: seed 002 stock (~4x)"]
    ax.barh(names, list(ratios.values()) + [4.0], color=["C0"] * len(ratios) + [PUBLISHED])
    ax.axvline(1.2, color="C3", linestyle="--", label="target 1.2x (at 0.5 s)")
    ax.set_xscale("log")
    ax.set_xlabel("makespan / VM-local makespan (log)")
    ax.legend(fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    save(folder, "workflow_ratios", fig, {"ratios": ratios, "published_seed002_ratio": 4.0})
    return [("workflow_makespan", "Makespan per staging mode", data),
            ("workflow_ratios", "Makespan relative to VM-local storage", {"ratios": ratios})]


def sizes(result: Dict[str, Any], folder: str) -> List[Figure]:
    plt = _pyplot()
    points = result["points"]
    rtts = sorted({p["rtt_ms"] for p in points})
    out: List[Figure] = []
    for direction in ("download", "upload"):
        fig, ax = plt.subplots(figsize=(7, 4))
        data: Dict[str, Any] = {}
        for tool in dict.fromkeys(p["tool"] for p in points):
            for style, rtt in zip(("-", "--", ":", "-."), rtts):
                line = sorted((p["size"], p["wall_s"]) for p in points
                              if p["tool"] == tool and p["rtt_ms"] == rtt and p["direction"] == direction)
                if line:
                    data[f"{tool} rtt {rtt:g}"] = line
                    ax.plot([max(s, 1) for s, _ in line], [w for _, w in line], style, marker="o",
                            color=f"C{list(dict.fromkeys(q['tool'] for q in points)).index(tool)}",
                            label=f"{tool}, rtt {rtt:g} ms")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("file size, bytes (0 B drawn at 1)")
        ax.set_ylabel("wall time of the whole command, s")
        ax.set_title(f"{direction}: time vs size (seed 002 Fig. 7 shape); load {result['load_average']}", fontsize=9)
        ax.legend(fontsize=6, ncol=2)
        save(folder, f"sizes_{direction}", fig, data)
        out.append((f"sizes_{direction}", f"Time vs size, {direction}", data))
    return out


def threads(result: Dict[str, Any], folder: str) -> List[Figure]:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    data: Dict[str, Any] = {}
    for tool in dict.fromkeys(p["tool"] for p in result["points"]):
        line = [(p["threads"], p["files_per_s"]) for p in result["points"] if p["tool"] == tool]
        data[tool] = line
        ax.plot([t for t, _ in line], [f for _, f in line], marker="o", label=tool)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("threads / workers")
    ax.set_ylabel("files per second")
    p = result["params"]
    ax.set_title(f"{p['count']} files of {p['size']} B, rtt {p['rtt_ms']:g} ms; published: seed 002 saw no "
                 "gain past 5 threads", fontsize=8)
    ax.legend()
    save(folder, "threads", fig, data)
    return [("threads", "Small-file stage-in rate vs threads", data)]


def large(result: Dict[str, Any], folder: str) -> List[Figure]:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    runs = result["runs"]
    labels = [f"{r['tool']} {r['direction']}" for r in runs]
    ax.barh(labels, [r["mb_per_s"] for r in runs], color=[TOOL_COLORS.get(r["tool"], "C1") for r in runs])
    ax.axvline(result["disk_write_mb_per_s"], color="C2", linestyle="--", label="disk write (fsync)")
    ax.set_xlabel("MB/s")
    ax.set_title(f"{result['params']['mib']} MiB on loopback; ours / best tool: {result['ours_fraction_of_limit']}; "
                 f"ours / Go pegasus-transfer: {result.get('ours_vs_go_throughput')}", fontsize=7)
    ax.legend(fontsize=8)
    data = {"runs": runs, "disk_write_mb_per_s": result["disk_write_mb_per_s"],
            "ours_fraction_of_limit": result["ours_fraction_of_limit"]}
    save(folder, "large", fig, data)
    return [("large", "Large file rate against the run's limit", data)]



def pool(result: Dict[str, Any], folder: str) -> List[Figure]:
    """Makespan and staging CPU per job of each configuration on the real pool."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    runs = result["runs"]
    labels = [r["config"] for r in runs]
    colors = [{"stock": "C1", "go": "C2"}.get(r["config"], "C0") for r in runs]
    left.barh(labels, [r["makespan_s"] for r in runs], color=colors)
    left.set_xlabel("DAGMan makespan (s)")
    right.barh(labels, [r["staging_cpu_per_job_s"] for r in runs], color=colors)
    right.set_xlabel("staging CPU per job (s)")
    right.set_yticks([])
    params = result["params"]
    fig.suptitle(f"Planned workflow on a real HTCondor pool: {params['producers']} x {params['files']} files, "
                 f"clustered by {params['cluster_size']}", fontsize=8)
    fig.tight_layout()
    data = {"runs": runs, "ratios": result["ratios"]}
    save(folder, "pool", fig, data)
    return [("pool", "Real pool: makespan and staging CPU per job, the stock tools (Python, Go) against ours", data)]

SEED003_GET_S = {"copy": {0: 0.016, 1: 0.031, 10: 0.178, 100: 3.951},
                 "symlink": {0: 0.017, 1: 0.033, 10: 0.146, 100: 1.841}}


def cache(result: Dict[str, Any], folder: str) -> List[Figure]:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    rows = result["latency_ms"]
    sizes_mb = [r["size_mb"] for r in rows]
    data: Dict[str, Any] = {"ours_ms": rows, "published_seed003_get_ms": {}}
    for i, key in enumerate(("get_hardlink_ms", "get_symlink_ms", "get_copy_ms", "put_hardlink_ms", "put_copy_ms")):
        ax.plot([max(s, 0.1) for s in sizes_mb], [max(r[key], 1e-3) for r in rows], marker="o", color=f"C{i}",
                label=f"ours {key[:-3].replace('_', ' ')}")
    for style, (method, table) in zip(("--", ":"), SEED003_GET_S.items()):
        data["published_seed003_get_ms"][method] = {k: v * 1000 for k, v in table.items()}
        ax.plot([max(s, 0.1) for s in table], [v * 1000 for v in table.values()], style, color=PUBLISHED,
                marker="x", label=f"published: seed 003 daemon get, {method}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("file size, MB (0 drawn at 0.1)")
    ax.set_ylabel("latency, ms (median)")
    ax.legend(fontsize=7)
    save(folder, "cache", fig, data)
    return [("cache", "Node cache put/get latency by method, beside seed 003", data)]


def disk(result: Dict[str, Any], folder: str) -> List[Figure]:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    samples = result["samples"]
    ax.plot([s["t_s"] for s in samples], [s["write_mb_per_s"] for s in samples], marker="o", label="ours: write+fsync")
    for value, label in ((128, "published: seed 002 AWS gp SSD, burst"), (9, "published: seed 002 AWS, credits gone"),
                         (33.6, "published: seed 002 Google PD-SSD 70 GB")):
        ax.axhline(value, color=PUBLISHED, linestyle=":", linewidth=1)
        ax.text(0, value, label, fontsize=6, va="bottom", color="0.3")
    ax.set_yscale("log")
    ax.set_xlabel("time, s")
    ax.set_ylabel("MB/s")
    p = result["params"]
    ax.set_title(f"timed disk benchmark: {p['transfer_mib']} MiB in {p['block_kib']} KiB blocks per sample", fontsize=8)
    ax.legend(fontsize=7)
    data = {"samples": samples, "published_mb_per_s": {"seed002_aws_burst": 128, "seed002_aws_after_credits": 9,
                                                        "seed002_google": 33.6}}
    save(folder, "disk", fig, data)
    return [("disk", "Disk write rate over time (seed 004 style)", data)]


def cost(rows: List[Dict[str, Any]], folder: str) -> List[Figure]:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    tables = list(rows[0]["usd"]) if rows else []
    width = 0.8 / max(1, len(tables))
    for i, table in enumerate(tables):
        ax.bar([x + i * width for x in range(len(rows))], [r["usd"][table] for r in rows], width, label=table)
    ax.set_xticks([x + width * (len(tables) - 1) / 2 for x in range(len(rows))])
    ax.set_xticklabels([f"{r['mode']}\n{r['compute_s']:g} s" for r in rows], fontsize=7)
    ax.set_ylabel("US$ per workflow run (requests)")
    ax.set_title("request cost per run, counted at the proxy for every mode; published: seed 000 Montage "
                 "+$0.28 (2010, full-size)", fontsize=7)
    ax.legend(fontsize=7)
    save(folder, "cost", fig, {"rows": rows, "published_seed000_montage_usd": 0.28})
    return [("cost", "Request cost per workflow run", {"rows": rows})]


def monitor(series: List[Dict[str, Any]], shifts: List[Dict[str, Any]], folder: str) -> List[Figure]:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for i, probe in enumerate(dict.fromkeys(s["probe"] for s in series)):
        points = [s for s in series if s["probe"] == probe and s.get("ok")]
        ax.plot([s["t"] for s in points], [s["seconds"] * 1000 for s in points], ".", color=f"C{i}", label=probe)
    for shift in shifts:
        ax.axvline(shift["t"], color="C3", linestyle="--", linewidth=1)
    ax.set_xlabel("unix time, s")
    ax.set_ylabel("latency, ms")
    ax.set_title("store probes over time (seed 002 Fig. 11 shape); dashed: detected shifts", fontsize=8)
    ax.legend(fontsize=7)
    save(folder, "monitor", fig, {"series": series, "shifts": shifts})
    return [("monitor", "Store probe latency over time", {"shifts": shifts})]

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
    _check_layout(name, fig)
    fig.savefig(png, dpi=90, bbox_inches="tight")  # legends placed beside the axes stay in the picture
    _pyplot().close(fig)
    with open(js, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, default=str)
    return png, js


def _check_layout(name: str, fig: Any) -> None:
    """ValueError unless ``fig`` reads without the docs: a plain title on every axes (no raw
    value, no seed paper's figure number) and every legend beside or above its axes, never
    over the data (the report marks such a figure FAILED)."""
    fig.canvas.draw()
    suptitle = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else ""
    for ax in fig.axes:
        title = ax.get_title() or suptitle
        if not title or "{" in title or "seed" in title.lower() or "Fig." in title:
            raise ValueError(f"figure {name}: title {title!r} is not plain")
        legend, box = ax.get_legend(), ax.get_window_extent()
        if legend is not None:
            where = legend.get_window_extent()
            if where.x0 < box.x1 - 1 and where.y0 < box.y1 - 1:
                raise ValueError(f"figure {name}: the legend covers the data")


def _legend_beside(ax: Any, size: int = 7) -> None:
    """The legend right of the axes, never over the data."""
    ax.legend(fontsize=size, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _mode_label(mode: str) -> str:
    return {"stock": "stock pegasus-transfer", "per-file": "ours, per file", "bundles+cache": "ours, bundles + cache",
            "stager": "ours, node stager", "vm-local": "VM-local (no staging)"}.get(mode, mode)


TOOL_COLORS = {"ours": "C0", "go": "C2"}  # every other tool (stock, s5cmd, curl) in C1
REFERENCE_COLOR = "0.3"  # a limit drawn across the bars (the disk's rate): grey, no tool's colour


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
        xs = [x + i * width for x in range(len(computes))]
        ax.bar(xs, values, width, color=f"C{i}", label=_mode_label(mode))
        if bounds:  # a lower bound is no bar: an open marker at the bound with an arrow up, labelled
            data["lower_bounds_not_charted"][mode] = bounds
            for x, c in zip(xs, computes):
                if str(c) in bounds:
                    ax.annotate(f"at least\n{bounds[str(c)]:.0f} s", xy=(x, bounds[str(c)]),
                                xytext=(x, bounds[str(c)] * 2.2), ha="center", fontsize=7, color=f"C{i}",
                                arrowprops={"arrowstyle": "<-", "color": f"C{i}"})
                    ax.plot([x], [bounds[str(c)]], marker="_", markersize=14, color=f"C{i}")
    ax.set_yscale("log")
    highest = max([v for m in data["makespan_s"].values() for v in m.values()] +
                  [v for b in data["lower_bounds_not_charted"].values() for v in b.values()] + [1.0])
    ax.set_ylim(top=highest * 5)  # room inside the axes for a lower bound's arrow and label
    ax.margins(x=0.08)  # and beside the first and last bar
    ax.set_xticks([x + width * (len(modes) - 1) / 2 for x in range(len(computes))])
    ax.set_xticklabels([f"{c:g} s of compute per job" for c in computes])
    ax.set_ylabel("makespan, s (log scale)")
    p = result["params"]
    ax.set_title(f"Workflow makespan by staging mode ({p['producers'] + 1} jobs, {p['rtt_ms']:g} ms to the store)",
                 fontsize=9)
    _legend_beside(ax)
    save(folder, "workflow_makespan", fig, data)
    ratios = {k: v for k, v in result["ratios"].items() if v is not None and "_vs_vm_local_at_" in k}
    bounded = {f"{m}_vs_vm_local_at_{float(c):g}s" for m, b in data["lower_bounds_not_charted"].items() for c in b}
    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = [_ratio_label(k) for k in ratios] + ["published: stock, seed 002 (about 4x)"]
    ax.barh(names, [0 if k in bounded else v for k, v in ratios.items()] + [4.0],
            color=["C0"] * len(ratios) + [PUBLISHED])
    for y, (key, value) in enumerate(ratios.items()):
        if key in bounded:  # a lower bound: a marker and an arrow to the right, no bar
            ax.plot([value], [y], marker="|", markersize=12, color="C0")
            ax.annotate(f"at least {value:.1f}x", xy=(value, y), xytext=(value * 2.2, y), va="center", fontsize=7,
                        arrowprops={"arrowstyle": "<-", "color": "C0"})
    ax.axvline(1.3, color="C3", linestyle="--", label="target 1.3x, drop-in alone")
    ax.axvline(1.1, color="C2", linestyle=":", label="target 1.1x, node stager")
    ax.set_xscale("log")
    ax.set_xlabel("makespan / VM-local makespan (log scale)")
    ax.set_title("Makespan relative to VM-local storage", fontsize=9)
    _legend_beside(ax)
    ax.tick_params(axis="y", labelsize=7)
    save(folder, "workflow_ratios", fig, {"ratios": ratios, "published_seed002_ratio": 4.0})
    return [("workflow_makespan", "Makespan per staging mode", data),
            ("workflow_ratios", "Makespan relative to VM-local storage", {"ratios": ratios})]


def _ratio_label(key: str) -> str:
    """``stager_vs_vm_local_at_0.5s`` -> ``ours, node stager, 0.5 s jobs``."""
    mode, _, compute = key.partition("_vs_vm_local_at_")
    return f"{_mode_label(mode)}, {compute.rstrip('s')} s jobs"


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
        ax.set_title(f"{direction.capitalize()} time by file size, one file per command", fontsize=9)
        _legend_beside(ax, 6)
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
    ax.set_title(f"Stage-in rate of {p['count']} files of {p['size']} B by threads", fontsize=9)
    _legend_beside(ax)
    save(folder, "threads", fig, data)
    return [("threads", "Small-file stage-in rate vs threads", data)]


def large(result: Dict[str, Any], folder: str) -> List[Figure]:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    runs = result["runs"]
    draw_large(ax, result)
    fraction = result["ours_fraction_of_limit"]
    shown = (", ".join(f"{k} {v:.2f}" for k, v in fraction.items()) if isinstance(fraction, dict)
             else f"{fraction}")
    go = result.get("ours_vs_go_throughput")
    if isinstance(go, dict) and go:
        shown += "; ours / Go pegasus-transfer: " + ", ".join(f"{k} {v:.2f}" for k, v in go.items() if v is not None)
    ax.set_title(f"One {result['params']['mib']} MiB file on loopback (ours / the best tool: {shown})", fontsize=8)
    _legend_beside(ax)
    data = {"runs": runs, "disk_write_mb_per_s": result["disk_write_mb_per_s"],
            "ours_fraction_of_limit": result["ours_fraction_of_limit"]}
    save(folder, "large", fig, data)
    return [("large", "Large file rate against the run's limit", data)]



def draw_large(ax: Any, result: Dict[str, Any]) -> Tuple[Any, Any]:
    """The large-file bars (one colour per tool) and the disk's write rate as a dashed line of
    a colour no tool has, on ``ax``; returns (the bars, the line)."""
    runs = result["runs"]
    labels = [f"{r['tool']} {r['direction']}" for r in runs]
    bars = ax.barh(labels, [r["mb_per_s"] for r in runs], color=[TOOL_COLORS.get(r["tool"], "C1") for r in runs])
    line = ax.axvline(result["disk_write_mb_per_s"], color=REFERENCE_COLOR, linestyle="--", label="disk write (fsync)")
    ax.set_xlabel("MB/s")
    return bars, line


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
    ax.set_title("Node cache: time to put and get a file, by size and method", fontsize=9)
    _legend_beside(ax)
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
        ax.text(1.01, value, label, fontsize=6, va="center", color="0.3",  # beside the axes, off the data
                transform=ax.get_yaxis_transform())
    ax.set_yscale("log")
    ax.set_xlabel("time, s")
    ax.set_ylabel("MB/s")
    p = result["params"]
    ax.set_title(f"Disk write rate over time ({p['transfer_mib']} MiB per sample)", fontsize=9)
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.08), borderaxespad=0.0)  # above: the right holds labels
    data = {"samples": samples, "published_mb_per_s": {"seed002_aws_burst": 128, "seed002_aws_after_credits": 9,
                                                        "seed002_google": 33.6}}
    save(folder, "disk", fig, data)
    return [("disk", "Disk write rate over time (seed 004 style)", data)]


def cost(rows: List[Dict[str, Any]], folder: str) -> List[Figure]:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.45 * max(1, len(rows))))
    tables = list(rows[0]["usd"]) if rows else []
    height = 0.8 / max(1, len(tables))
    for i, table in enumerate(tables):  # horizontal bars: the run names never overlap
        ax.barh([y + i * height for y in range(len(rows))], [100 * r["usd"][table] for r in rows], height,
                label=table)
    ax.set_yticks([y + height * (len(tables) - 1) / 2 for y in range(len(rows))])
    ax.set_yticklabels([f"{_mode_label(r['mode'])}, {r['compute_s']:g} s jobs"
                        + (" (scaled from a sample)" if r.get("extrapolated") else "") for r in rows], fontsize=7)
    ax.xaxis.set_major_locator(plt.MaxNLocator(5))  # a few round ticks: long ones overlapped
    ax.set_xlabel("US cents of requests per workflow run")
    ax.set_title("Request cost of one workflow run, by staging mode and price table", fontsize=9)
    _legend_beside(ax)
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
    ax.set_title("Store latency over time (dashed: a detected shift)", fontsize=9)
    _legend_beside(ax)
    save(folder, "monitor", fig, {"series": series, "shifts": shifts})
    return [("monitor", "Store probe latency over time", {"shifts": shifts})]

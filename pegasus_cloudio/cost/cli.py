"""Request cost of a workflow's staging, per site and job type, from transfer-attempt records.

``pegasus-cloudio cost SUBMIT_DIR_OR_FILES... [--prices FILE] [--table NAME ...] [--json]``
reads the ``transfer_attempts`` records under the paths (a Pegasus submit directory, job
``.out`` files, or the drop-in's multipart files) and prices the requests with each table.
``--dump-prices`` prints the default tables in the JSON form ``--prices`` reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional

from pegasus_cloudio.cost.prices import DEFAULT_TABLES, PriceTable, dump_tables, load_tables
from pegasus_cloudio.cost.records import Usage, as_rows, read_usage


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", help="submit directory, job .out files or multipart files")
    parser.add_argument("--prices", help="JSON price tables (default: the built-in tables)")
    parser.add_argument("--table", action="append", help="price table(s) to use (default: all)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument("--dump-prices", action="store_true", help="print the default price tables as JSON")


def _tables(args: argparse.Namespace) -> List[PriceTable]:
    tables = load_tables(args.prices) if args.prices else dict(DEFAULT_TABLES)
    wanted = args.table or list(tables)
    missing = [name for name in wanted if name not in tables]
    if missing:
        raise ValueError(f"unknown price table {', '.join(missing)} (have: {', '.join(sorted(tables))})")
    return [tables[name] for name in wanted]


def bill(rows: List[Dict[str, Any]], tables: List[PriceTable]) -> Dict[str, Any]:
    """``rows`` (with class_a, class_b, bytes_down) given a dollar column per table, plus totals."""
    total = Usage()
    for row in rows:
        total.class_a += int(row["class_a"])
        total.class_b += int(row["class_b"])
        row["usd"] = {t.name: round(t.cost(int(row["class_a"]), int(row["class_b"]), int(row["bytes_down"])), 6)
                      for t in tables}
    return {"rows": rows, "total_class_a": total.class_a, "total_class_b": total.class_b,
            "total_usd": {t.name: round(sum(r["usd"][t.name] for r in rows), 6) for t in tables},
            "tables": dump_tables(tables)}


def main(args: argparse.Namespace) -> int:
    if args.dump_prices:
        json.dump(dump_tables(list(DEFAULT_TABLES.values())), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not args.paths:
        print("pegasus-cloudio cost: give a submit directory or record files", file=sys.stderr)
        return 2
    try:
        tables = _tables(args)
        totals, files = read_usage(args.paths)
    except (OSError, ValueError) as err:
        print(f"pegasus-cloudio cost: {err}", file=sys.stderr)
        return 1
    result = bill(as_rows(totals), tables)
    result["files_with_records"] = files
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_table(result))
    return 0


def format_table(result: Dict[str, Any], note: Optional[str] = None, *, total: bool = True) -> str:
    names = [t["name"] for t in result["tables"]]
    head = f"{'site':<14} {'job type':<24} {'class A':>8} {'class B':>8} {'MB up':>9} {'MB down':>9} "
    lines = [head + " ".join(f"{'$ ' + n:>12}" for n in names)]
    for r in result["rows"]:
        lines.append(f"{r['site']:<14} {r['job_type']:<24} {r['class_a']:>8} {r['class_b']:>8} "
                     f"{r['bytes_up'] / 1e6:>9.3f} {r['bytes_down'] / 1e6:>9.3f} "
                     + " ".join(f"{r['usd'][n]:>12.6f}" for n in names))
    if total:
        lines.append(f"{'total':<39} {result['total_class_a']:>8} {result['total_class_b']:>8} {'':>19} "
                     + " ".join(f"{result['total_usd'][n]:>12.6f}" for n in names))
    for t in result["tables"]:
        lines.append(f"prices {t['name']}: {t['source']} ({t['date']})")
    if note:
        lines.append(note)
    return "\n".join(lines)

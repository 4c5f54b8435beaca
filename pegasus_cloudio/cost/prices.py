"""Price tables for object-store requests, storage and data transfer.

A table is a frozen `PriceTable`; the defaults are list prices as published by the providers
for their standard storage class in their main US region, with the date we took them, and
the 2010 S3 prices the seed study used (``seeds/000``: $0.01 per 1,000 PUTs and per 10,000
GETs, $0.15 per GB-month, transfers free inside EC2). Prices change: pass ``--prices FILE``
(a JSON list of tables, the shape ``pegasus-cloudio cost --dump-prices`` prints) to use
current or negotiated ones.

Request classes: uploads, copies, listings and multipart calls are "class A" (S3 "PUT, COPY,
POST, LIST"); downloads and HEADs are "class B" (S3 "GET, SELECT and all other"); DELETEs
are free on both stores.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Sequence

from transfer.lean import asdict, fields, record

__all__ = ["DEFAULT_TABLES", "PriceTable", "load_tables", "request_class"]


@record(frozen=True)
class PriceTable:
    """Prices in US dollars.

    Fields:
        name: short name used on the command line (``--table s3-2024``).
        date: when the prices were published or taken (ISO date or year-month).
        source: where they come from, in words.
        class_a_per_1000: per 1,000 class A requests (PUT, POST, COPY, LIST).
        class_b_per_1000: per 1,000 class B requests (GET, HEAD).
        egress_per_gb: per GB (10^9 bytes) downloaded out of the store's network; the
            defaults assume workers in the same region, where transfer is free, so 0.
        storage_per_gb_month: per GB-month stored (reported, not charged per workflow).
    """

    name: str
    date: str
    source: str
    class_a_per_1000: float
    class_b_per_1000: float
    egress_per_gb: float = 0.0
    storage_per_gb_month: float = 0.0

    def requests_cost(self, class_a: int, class_b: int) -> float:
        return class_a * self.class_a_per_1000 / 1000.0 + class_b * self.class_b_per_1000 / 1000.0

    def cost(self, class_a: int, class_b: int, bytes_out: int) -> float:
        """Dollars for these requests plus ``bytes_out`` leaving the store."""
        return self.requests_cost(class_a, class_b) + bytes_out / 1e9 * self.egress_per_gb


DEFAULT_TABLES: Dict[str, PriceTable] = {t.name: t for t in (
    PriceTable("s3-2024", "2024-09", "AWS S3 Standard list prices, us-east-1, as published on the S3 pricing page",
               class_a_per_1000=0.005, class_b_per_1000=0.0004, storage_per_gb_month=0.023),
    PriceTable("gcs-2024", "2024-09", "Google Cloud Storage Standard list prices (class A/B operations), "
               "us-central1, as published on the GCS pricing page",
               class_a_per_1000=0.005, class_b_per_1000=0.0004, storage_per_gb_month=0.020),
    PriceTable("s3-2010", "2010", "S3 prices used by the seed study (seeds/000): $0.01 per 1,000 PUTs and "
               "per 10,000 GETs, $0.15 per GB-month, transfers free within EC2",
               class_a_per_1000=0.01, class_b_per_1000=0.001, storage_per_gb_month=0.15),
)}

_CLASS_A = {"PUT", "POST", "COPY", "LIST"}
_CLASS_B = {"GET", "HEAD"}


def request_class(method: str) -> str:
    """``"A"``, ``"B"`` or ``""`` (free) for an HTTP method or S3 operation name."""
    upper = method.upper()
    return "A" if upper in _CLASS_A else "B" if upper in _CLASS_B else ""


def load_tables(path: str) -> Dict[str, PriceTable]:
    """The tables in the JSON file ``path`` (a list of objects with `PriceTable`'s fields).

    Raises ValueError naming the file and the entry when one is malformed.
    """
    with open(path, encoding="utf-8") as fh:
        try:
            raw = json.load(fh)
        except ValueError as err:
            raise ValueError(f"{path}: not JSON: {err}") from err
    if not isinstance(raw, list):
        raise ValueError(f"{path}: expected a JSON list of price tables")
    tables: Dict[str, PriceTable] = {}
    for index, entry in enumerate(raw):
        table = _table(path, index, entry)
        tables[table.name] = table
    return tables


def _table(path: str, index: int, entry: Any) -> PriceTable:
    names = {f.name for f in fields(PriceTable)}
    if not isinstance(entry, dict) or not {"name", "date", "source"} <= set(entry) or set(entry) - names:
        raise ValueError(f"{path}: entry {index}: needs name, date, source and only {sorted(names)}")
    try:
        table = PriceTable(**entry)
        numbers = [float(v) for k, v in asdict(table).items() if k not in ("name", "date", "source")]
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: entry {index} ({entry.get('name')}): {err}") from err
    if min(numbers) < 0:
        raise ValueError(f"{path}: entry {index} ({table.name}): prices must not be negative")
    return table


def dump_tables(tables: Sequence[PriceTable]) -> List[Dict[str, Any]]:
    """The JSON form `load_tables` reads."""
    return [asdict(t) for t in tables]

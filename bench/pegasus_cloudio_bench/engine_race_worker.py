"""One contestant of :mod:`pegasus_cloudio_bench.engine_race`, in its own process; imports
nothing but its engine (and the standard library), so start-up costs compare fairly."""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, List

BUCKET = "race"


def _write(directory: str, name: str, data: bytes) -> None:
    tmp = os.path.join(directory, f".{name}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
    os.replace(tmp, os.path.join(directory, name))


def _fetch_ours(endpoint: str, key: str, secret: str, names: List[str], out: str, threads: int) -> None:
    import io

    from transfer import Session, Settings, parse_url

    creds = os.path.join(out, ".creds")
    fd = os.open(creds, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"[race]\nendpoint = {endpoint}\n[b@race]\naccess_key = {key}\nsecret_key = {secret}\n")
    with Session(Settings(threads=threads), {"PEGASUS_CREDENTIALS": creds, "HOME": out}) as session:
        backend = session.backend(parse_url(f"s3://b@race/{BUCKET}/x"))

        def one(name: str) -> None:
            sink = io.BytesIO()
            backend.get(parse_url(f"s3://b@race/{BUCKET}/{name}"), sink)
            _write(out, name, sink.getvalue())

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, names))


def _fetch_obstore(endpoint: str, key: str, secret: str, names: List[str], out: str, threads: int) -> None:
    import obstore
    from obstore.store import S3Store

    store = S3Store(BUCKET, endpoint=endpoint, access_key_id=key, secret_access_key=secret, region="us-east-1",
                    virtual_hosted_style_request=False, client_options={"allow_http": True})

    def one(name: str) -> None:
        _write(out, name, bytes(obstore.get(store, name).bytes()))

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, names))


ENGINES: Dict[str, Callable[..., None]] = {"ours": _fetch_ours, "obstore": _fetch_obstore}


def main(argv: List[str]) -> None:
    engine, endpoint, key, secret, names_file, out, threads = argv
    names = Path(names_file).read_text().split("\n")
    ENGINES[engine](endpoint, key, secret, names, out, int(threads))



if __name__ == "__main__":
    main(sys.argv[1:])

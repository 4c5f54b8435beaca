"""Which cases a reader must run: one mix-in per capability protocol, picked by ``isinstance``.

The table is the whole list: every capability protocol of :mod:`transfer.backends.base`
(``tests/test_backend_contract.py`` fails one without a row), ``close`` and the layers'
``fetch_to``/``prepare``.
"""

from __future__ import annotations

from typing import List, Tuple

from pegasus_cloudio_testbed.contract import layers, reads, stores, writes

MIXINS: Tuple[type, ...] = (
    layers.ClosesContract, layers.LayerContract,
    stores.UploadsContract, stores.NamespaceContract, stores.DirectoryListingContract,
    stores.PagedListingContract, stores.TreeRemovalContract, stores.TouchesContract, stores.BucketsContract,
    stores.BucketRemovalContract,
    writes.BatchWritesContract, writes.MultipartUploadsContract, writes.PendingUploadsContract, writes.ExclusiveCreateContract,
    writes.ConditionalPutsContract, writes.AttributedPutsContract, writes.ServerSideCopyContract,
    writes.TempUploadsContract,
    reads.RangedReadsContract, reads.BatchReadsContract, reads.DialsAheadContract, reads.CacheKeysContract,
    reads.PeerScopesContract, reads.PresignsContract,
)


def mixins_for(reader: object) -> List[type]:
    """The mix-ins of every capability ``reader`` claims (``isinstance`` of the protocol)."""
    return [mixin for mixin in MIXINS if isinstance(reader, mixin.capability)]  # type: ignore[attr-defined]


def unclaimed_mixins(cls: type, reader: object) -> List[type]:
    """The capability mix-ins ``cls`` inherits whose protocol ``reader`` does not claim."""
    return [mixin for mixin in MIXINS if issubclass(cls, mixin) and mixin not in mixins_for(reader)]

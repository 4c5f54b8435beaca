"""The contract suite for backends and read layers, importable by any backend's tests
(the way ``fsspec.tests.abstract`` is): a base class of cases that needs three fixtures,
and one mix-in per capability protocol of :mod:`transfer.backends.base` (besides
``ClosesContract`` for ``close`` and ``LayerContract`` for the layers' ``fetch_to`` and ``prepare``).

Run it on your own backend::

    from pegasus_cloudio_testbed.contract import ClosesContract, ReadContract, UploadsContract, NamespaceContract

    class TestMyStore(ReadContract, ClosesContract, UploadsContract, NamespaceContract):
        @pytest.fixture
        def base_url(self, my_server):            # new and empty for each test
            return f"mine://{my_server.make_bucket()}"

        @pytest.fixture
        def reader(self, my_server):              # the backend (or a stack of layers) under test
            backend = MyBackend(my_server.endpoint)
            yield backend
            backend.close()

        @pytest.fixture
        def seed(self, my_server, base_url):      # store bytes by the server's own API
            return lambda key, data: my_server.put(f"{base_url}/{key}", data)

``url_for(key)`` may be overridden too (:mod:`.base` documents all four). The class must list
the mix-in of every capability its reader claims (``isinstance`` of the protocol) and no
other: :meth:`ReadContract.test_claimed_capabilities_run_their_cases` fails otherwise, so a
capability cannot skip its cases. :func:`mixins_for` lists them for a reader, and
:func:`contract_for` builds the base class from one. A mix-in's class attributes adapt it to
a store (``NamespaceContract.page_size``: the listing page; ``MultipartUploadsContract.part_bytes``:
the smallest part but the last; ``BucketsContract.missing_bucket_url``).
:class:`CutBodiesContract` (optional, with a fourth fixture: a relay that cuts answers)
checks that a body cut short is never taken for the whole. :func:`known_defect` marks a case
a backend is known to fail (a strict xfail naming the defect).
Needs pytest (``pip install 'pegasus-cloudio-bench[contract]'``).
"""

from pegasus_cloudio_testbed.contract.base import AWKWARD_KEYS, ContractBase, known_defect
from pegasus_cloudio_testbed.contract.core import ReadContract, contract_for
from pegasus_cloudio_testbed.contract.faults import CutBodiesContract
from pegasus_cloudio_testbed.contract.layers import Closes, ClosesContract, FetchesTo, LayerContract
from pegasus_cloudio_testbed.contract.reads import (
    BatchReadsContract,
    CacheKeysContract,
    DialsAheadContract,
    PeerScopesContract,
    PresignsContract,
    RangedReadsContract,
)
from pegasus_cloudio_testbed.contract.select import MIXINS, mixins_for, unclaimed_mixins
from pegasus_cloudio_testbed.contract.stores import (
    BucketRemovalContract,
    BucketsContract,
    DirectoryListingContract,
    NamespaceContract,
    PagedListingContract,
    TouchesContract,
    TreeRemovalContract,
    UploadsContract,
)
from pegasus_cloudio_testbed.contract.writes import (
    AttributedPutsContract,
    BatchWritesContract,
    ConditionalPutsContract,
    ExclusiveCreateContract,
    MultipartUploadsContract,
    PendingUploadsContract,
    ServerSideCopyContract,
    TempUploadsContract,
)

__all__ = [
    "AWKWARD_KEYS", "AttributedPutsContract", "BatchReadsContract", "BatchWritesContract", "BucketRemovalContract", "BucketsContract", "CacheKeysContract",
    "Closes", "ClosesContract", "ConditionalPutsContract", "ContractBase", "CutBodiesContract",
    "DialsAheadContract", "DirectoryListingContract", "ExclusiveCreateContract", "FetchesTo", "LayerContract",
    "MIXINS", "MultipartUploadsContract", "NamespaceContract", "PagedListingContract", "PeerScopesContract",
    "PendingUploadsContract", "PresignsContract", "RangedReadsContract", "ReadContract",
    "ServerSideCopyContract", "TempUploadsContract", "TouchesContract", "TreeRemovalContract",
    "UploadsContract", "contract_for", "known_defect", "mixins_for", "unclaimed_mixins",
]

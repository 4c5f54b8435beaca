"""A node-local, write-once cache of whole objects shared by every process on a node.

Workflow files are written once and never updated, so what one job fetched can serve
every later job on the node: ``NodeCache.fetch`` links (or copies) a cached entry into the
job's directory, and on a miss lets exactly one process per key download while the others
wait. See docs/cache.md for the layout on disk, the locking protocol and the guarantees.

Typical use (the engine does this)::

    cache = cache_from_settings(os.environ)          # None when PEGASUS_CLOUDIO_CACHE_DIR=off
    size, hit = cache.fetch(key, "/job/in.dat", lambda sink: backend.get(url, sink))
    cache.close()                                     # persist counters, once per batch

Its names are imported when first used (PEP 562), so that ``transfer.cache.config`` can be
read (is the cache wanted at all?) without loading the cache itself.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from transfer.cache.config import CacheConfig, config_from_env
    from transfer.cache.evict import EntryInfo
    from transfer.cache.stats import CacheStats
    from transfer.cache.store import NodeCache, cache_from_settings

__all__ = ["CacheConfig", "CacheStats", "EntryInfo", "NodeCache", "cache_from_settings", "config_from_env"]
_HOMES = {"CacheConfig": "config", "config_from_env": "config", "EntryInfo": "evict", "CacheStats": "stats",
          "NodeCache": "store", "cache_from_settings": "store"}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = __import__(f"{__name__}.{home}", fromlist=[name])
    value = getattr(module, name)
    globals()[name] = value
    return value

"""``pegasus-cloudio cache``: inspect and maintain the node cache (see transfer.cache)."""

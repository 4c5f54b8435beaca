"""The cache daemon and the pool-side tools of peer-to-peer sharing (see docs/p2p.md)."""

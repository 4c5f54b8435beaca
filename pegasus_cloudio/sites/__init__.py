"""Pegasus 5 catalog sets (sites, transformations, replicas, properties) for the three staging
modes, built with the Pegasus Python API: ``pegasus-cloudio sites`` (see :mod:`.cli`)."""

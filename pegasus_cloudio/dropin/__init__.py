"""Drop-in replacement for Pegasus WMS pegasus-transfer: CLI, spec parsing, reporting."""

"""Fixtures for the gcs tests (filled in by the gcs work)."""

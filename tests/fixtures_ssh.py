"""Fixtures for the ssh tests (filled in by the ssh work)."""

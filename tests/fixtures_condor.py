"""Fixtures for the condor tests (filled in by the condor work)."""

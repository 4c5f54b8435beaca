"""Benchmarks that compare pegasus-cloudio with the stock tools in the same run."""

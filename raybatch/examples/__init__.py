"""Workloads bundled with raybatch, on data that ships in a package (no downloads)."""

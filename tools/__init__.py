"""Command-line tools behind ./book (execute, coverage, tests, study) and their shared helpers."""

"""The read-only query API (issue: running it for real). Being built."""

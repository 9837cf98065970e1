"""The mirroring proxy (issue: the mirroring proxy). Not built yet."""

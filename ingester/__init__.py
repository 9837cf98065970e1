"""ingester."""

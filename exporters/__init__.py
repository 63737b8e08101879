"""Output side: format the latest Snapshot (Prometheus, JSON lines). Nothing here reads hardware."""

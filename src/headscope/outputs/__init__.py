"""Outputs: terminal tables, CSV/JSON, views (heatmaps), compare."""

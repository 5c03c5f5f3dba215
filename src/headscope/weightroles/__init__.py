"""Roles read from weights alone: OV copying, copy suppression, successor heads."""

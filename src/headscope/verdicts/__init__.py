"""Verdicts: bootstrap intervals, the tidy results table, and the head-role rule."""

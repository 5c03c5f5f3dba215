"""Sweeps over many models or checkpoints: specs, the resumable store, executors (local, Ray)."""

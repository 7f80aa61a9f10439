"""Optimizers (being written)."""

"""Layers (being written)."""

"""Placeholder: being written (axpy needed by the tape)."""

"""Measured memory: the tracker, full-size dry runs on fake tensors (and, later, scaled real runs and GPU runs)."""

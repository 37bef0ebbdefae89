"""Measured memory: the tracker, full-size dry runs on fake tensors (and, later, scaled real runs and GPU runs)."""

from helpers.measure import fakegpu

fakegpu.register_backend()     # before any backward pass in this process (see fakegpu.register_backend)

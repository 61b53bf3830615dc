"""Hardware probe: measure the machine once, cache the profile per GPU, and let the plan read it.

Importing this package does not import torch (the measurement imports it inside its functions).
  profile.py    HardwareProfile and Fact (value + measured/read/assumed/unavailable + note), JSON round trip
  measure.py    measure_profile(depth) -> HardwareProfile; identify() for the cache key
  host.py device.py nvml.py bandwidth.py   one source of facts each
  cache.py      get_profile(refresh=..., depth=...): the cached profile, or a fresh measurement saved atomically
"""
from __future__ import annotations

from .cache import ProbeResult, cache_root, get_profile
from .profile import SOURCES, Fact, HardwareProfile, assumed, measured, read, unavailable

__all__ = ["Fact", "HardwareProfile", "ProbeResult", "SOURCES", "assumed", "cache_root", "get_profile", "measured",
           "read", "unavailable"]

"""Expert offload: the routed experts in (pinned) host RAM, an LRU cache of expert slots on the GPU."""

"""KV memory and caches: the KV owner, the radix tree, pins, the host tier, the pool and its slots."""

"""The default paged KV cache manager (registered by core as ``paged``): block pool, prefix cache, manager."""

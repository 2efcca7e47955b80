"""The memory manager: Guaranteed containers' memory pinned to NUMA nodes."""

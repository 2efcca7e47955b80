"""The topology manager: NUMA alignment of the resource managers' allocations."""

"""The lowest layer: records, errors, the registry, the caches, the algorithms' maths and the kernels. Imports nothing of verirl above it."""

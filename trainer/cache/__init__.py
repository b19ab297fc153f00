"""The trainer-side hot-embedding cache with bounded staleness (HET) and its hot-set profiler (FAE)."""

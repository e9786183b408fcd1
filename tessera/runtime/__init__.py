"""Runtime: the C toolchain, the kernel cache, loading and launching compiled programs."""
from .cache import cache_dir, cache_stats, reset_cache_stats

__all__ = ["cache_dir", "cache_stats", "reset_cache_stats"]

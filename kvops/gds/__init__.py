"""Keeping an LMCache GDS directory healthy: `prune` (a byte budget or an age, safe while the
engines that share it run), `units` (the sizes and durations its options take)."""

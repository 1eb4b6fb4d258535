"""Fluid cache prewarm for scale-from-zero and scale-out: ``plan`` (pure), ``shell`` (I/O)."""

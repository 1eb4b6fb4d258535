"""The Kueue admission-check controller for training workloads."""

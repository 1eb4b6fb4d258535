"""Scrapes vLLM and SGLang replicas and derives the signals the scaler reads (issue #3)."""

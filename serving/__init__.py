"""The inference gateway, vLLM launch profiles and the simulated replica (issue #5)."""

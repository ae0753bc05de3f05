"""Inference engines behind one interface (generate, prefill) and the model registry."""

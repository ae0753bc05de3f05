"""Mixture-of-experts: upcycled model, per-expert commitments, expert-level validation, attacks."""

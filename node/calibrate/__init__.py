"""Calibration: measured honest and attack runs → thresholds, error rates, profile and report."""

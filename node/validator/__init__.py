"""Validator mode: verify inferences (stage 1, stage 2) and, with the daemon, sign verdicts."""

"""Checks on an artifact: measurements (frozen results) separate from decisions."""

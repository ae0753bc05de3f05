"""Protocol v1 as an executable spec (DESIGN.md §2): pure functions, no I/O, clock or global RNG."""

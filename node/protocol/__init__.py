"""Protocol v1 as an executable spec (docs/protocol.md): pure functions, no I/O, clock or global RNG."""

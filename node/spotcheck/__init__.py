"""Memory spot checks (issue 18): stuffed device memory, nonce-seeded challenges, a latency bound, verdicts.

Pure modules (no I/O, clock or global RNG; testable like protocol code): ``errors``, ``stuffing``,
``answers``, ``wire``, ``feasibility``, ``verify``. Adapters: ``workload`` (torch), ``device`` (worker
processes), ``pinger``, ``sim`` (the orchestration), ``record`` (the workload record).
"""

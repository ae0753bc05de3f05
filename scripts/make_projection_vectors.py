"""Write the protocol v2 projection-fingerprint golden vectors (tests/vectors/projection_v2.json).

The file pins node.protocol.projection to the bit: seed rule, matrix, codes, blob and distance.
Regenerate only for a deliberate protocol change: `python scripts/make_projection_vectors.py`, then review the diff.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from node.protocol.hashing import keccak256
from node.protocol.projection import (
    LAST_HIDDEN,
    ProjectionSpec,
    build_projection_blob,
    compute_projection_matrix,
    compute_projection_seed,
    compute_source_seed,
    decode_projection_blob,
    verify_projection_blob,
)
from node.protocol.seed import run_seed

VECTORS_PATH = Path(__file__).resolve().parent.parent / "tests" / "vectors" / "projection_v2.json"
SPECS = (ProjectionSpec((LAST_HIDDEN,), 16, 2), ProjectionSpec((LAST_HIDDEN,), 32, 1),
         ProjectionSpec((14, LAST_HIDDEN), 8, 4), ProjectionSpec((LAST_HIDDEN,), 4, 8),
         ProjectionSpec((0, LAST_HIDDEN), 1, 16))


def make_rows(rows: int, hidden: int, phase: float) -> np.ndarray:
    """Return deterministic float32 hidden rows (no RNG: a closed form any language can reproduce)."""
    i, j = np.meshgrid(np.arange(rows), np.arange(hidden), indexing="ij")
    return np.asarray((np.sin(0.37 * i + 0.11 * j + phase) * (1 + (j % 7 == 0) * 9)).astype(np.float32))


def build_vectors() -> dict[str, Any]:
    """Return every vector of the file."""
    seeds = []
    for user_seed, iid, block in ((0, 0, b"\x00" * 32), (42, 7, keccak256(b"block"))):
        rs = run_seed(user_seed, iid)
        seeds.append({"run_seed": "0x" + rs.hex(), "block_hash": "0x" + block.hex(),
                      "projection_seed": "0x" + compute_projection_seed(rs, block).hex()})
    seed = bytes.fromhex(seeds[1]["projection_seed"][2:])
    matrices = [{"seed": "0x" + compute_source_seed(seed, j).hex(), "k": 4, "hidden": 24,
                 "signs": ["".join("1" if v > 0 else "0" for v in row)
                           for row in compute_projection_matrix(compute_source_seed(seed, j), 4, 24)]}
                for j in (0, 1)]
    blobs = []
    for spec in SPECS:
        sources = [make_rows(5, 64, 0.3 * j) for j in range(len(spec.layers))]
        own = [s + make_rows(5, 64, 1.0 + j) * 0.05 for j, s in enumerate(sources)]
        blob = build_projection_blob(sources, spec, seed)
        m = verify_projection_blob(blob, spec, seed, own)
        blobs.append({"layers": list(spec.layers), "k": spec.k, "bits": spec.bits, "rows": 5, "hidden": 64,
                      "blob": "0x" + blob.hex(), "fingerprint_hash": "0x" + keccak256(blob).hex(),
                      "codes": [[" ".join(str(int(v)) for v in row) for row in c]
                                for c in decode_projection_blob(blob, spec, seed, 5)],
                      "distance_to_perturbed": round(m.distance, 12)})
    return {"version": 2, "seed": seeds, "matrix": matrices, "blob": blobs}


def main() -> None:
    """Write the vectors file."""
    VECTORS_PATH.write_text(json.dumps(build_vectors(), indent=1) + "\n")


if __name__ == "__main__":
    main()

"""A window verdict on the existing signed-verdict path (the adapter to chain.eip712 and the validator's store).

Nothing new is signed: a spot-check window becomes the same EIP-712 ``Verdict`` the validator signs for an
inference — ``inferenceId`` := the window id, ``artifactRoot`` := the sha256 of the window's measurement
(the record slice it was decided on), ``valid``, ``reason`` := a spot-check code, ``scoresDigest`` := the
sha256 of the policy it was decided under — and goes through the same slashing-protection record
(``Store.record_verdict``: synced before the signature exists, a conflicting decision refused). A
spot-check contract (its own EIP-712 domain, so a window id can never be mistaken for an inference id)
would accept a quorum of these and feed the same reputation update; that contract is not built here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from enum import IntEnum

from chain.eip712 import Verdict
from node.spotcheck.verify import SpotcheckPolicy, WindowMeasurement, WindowVerdict
from node.store.leveldb import VerdictRecord

WINDOW_DOMAIN = b"verinfer/spotcheck/window/v1"


class SpotReason(IntEnum):
    """Spot-check reason codes (8xx, Reason.SPOT_*); the first failure found wins."""

    OK = 0
    WRONG_LABELS = 800
    WRONG_STATE = 801
    STALE_STATE = 802
    UNKNOWN_STEP = 803
    CAPACITY = 804
    LATE = 805
    MISSING = 806
    TOO_FEW_CHALLENGES = 807


def compute_window_id(run_id: str, device_id: str, window: int) -> int:
    """Return the uint256 id of one device's window: sha256(domain ‖ run ‖ device ‖ window)."""
    payload = json.dumps([run_id, device_id, window], separators=(",", ":")).encode()
    return int.from_bytes(hashlib.sha256(WINDOW_DOMAIN + payload).digest(), "big")


def compute_measurement_root(m: WindowMeasurement) -> bytes:
    """Return sha256 of the measurement's canonical JSON: what the verdict was decided on."""
    return hashlib.sha256(json.dumps(asdict(m), sort_keys=True, separators=(",", ":")).encode()).digest()


def get_reason(verdict: WindowVerdict) -> SpotReason:
    """Return the verdict's reason: the highest-precedence failure (wrong answers before timing)."""
    failures = set(verdict.failures)
    return next((reason for reason in SpotReason if reason.name.lower() in failures), SpotReason.OK)


def to_verdict(verdict: WindowVerdict, m: WindowMeasurement, policy: SpotcheckPolicy, run_id: str,
               deadline: int) -> Verdict:
    """Return the EIP-712 verdict of one window, ready for chain.eip712.sign_verdict."""
    policy_digest = hashlib.sha256(policy.model_dump_json().encode()).digest()
    return Verdict(compute_window_id(run_id, verdict.device_id, verdict.window), compute_measurement_root(m),
                   verdict.passed, int(get_reason(verdict)), policy_digest, deadline)


def to_verdict_record(verdict: Verdict) -> VerdictRecord:
    """Return the slashing-protection record of a window verdict (Store.record_verdict before signing)."""
    return VerdictRecord(verdict.inference_id, "0x" + verdict.artifact_root.hex(), verdict.valid, verdict.reason,
                         "0x" + verdict.scores_digest.hex(), verdict.deadline)

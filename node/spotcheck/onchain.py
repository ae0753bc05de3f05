"""A window verdict as a signed vote of the SpotCheck module (chain.spotcheck), behind the slashing-protection record.

A verifier turns each ``WindowVerdict`` into a ``WindowVerdict`` vote of the module's own EIP-712 domain
("verinfer-spotcheck", "1"): ``runId`` := sha256(domain ‖ run id), ``windowId`` := the window id
(run, device, window), ``measurementRoot`` := the sha256 of the window's measurement (the record slice it was
decided on), ``valid``, ``reason`` := a spot-check code (8xx), ``policyDigest`` := the sha256 of the policy.
Before the signature exists the decision goes through the validator's slashing-protection record
(``Store.record_verdict``: synced, a conflicting decision for the same window refused), exactly as an
inference verdict does; the Store is opened for the SpotCheck contract's address, so its ids never meet
the hub's inference ids.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from enum import IntEnum

from eth_account.signers.local import LocalAccount

from chain.spotcheck import WindowVote, sign_window_vote
from node.spotcheck.verify import SpotcheckPolicy, WindowMeasurement, WindowVerdict
from node.store.leveldb import Store, VerdictRecord

WINDOW_DOMAIN = b"verinfer/spotcheck/window/v1"
RUN_DOMAIN = b"verinfer/spotcheck/run/v1"


class SpotReason(IntEnum):
    """Spot-check reason codes (8xx, Reason.SPOT_*); the first failure in this (definition) order wins."""

    OK = 0
    WRONG_LABELS = 800
    WRONG_STATE = 801
    STALE_STATE = 802
    UNKNOWN_STEP = 803
    FABRICATED_STEP = 809
    CAPACITY = 804
    IDLE_CAPACITY = 808
    LATE = 805
    MISSING = 806
    TOO_FEW_CHALLENGES = 807


@dataclass(frozen=True)
class WindowDecision:
    """What a verifier signs for one device window (the fields of the module's WindowVerdict but the operator)."""

    run_key: bytes
    window_key: bytes
    valid: bool
    reason: int
    measurement_root: bytes
    policy_digest: bytes


def compute_window_id(run_id: str, device_id: str, window: int) -> int:
    """Return the uint256 id of one device's window: sha256(domain ‖ run ‖ device ‖ window)."""
    payload = json.dumps([run_id, device_id, window], separators=(",", ":")).encode()
    return int.from_bytes(hashlib.sha256(WINDOW_DOMAIN + payload).digest(), "big")


def compute_run_key(run_id: str) -> bytes:
    """Return the bytes32 run id the operator opens on chain: sha256(domain ‖ run id)."""
    return hashlib.sha256(RUN_DOMAIN + run_id.encode()).digest()


def compute_measurement_root(m: WindowMeasurement) -> bytes:
    """Return sha256 of the measurement's canonical JSON: what the verdict was decided on."""
    return hashlib.sha256(json.dumps(asdict(m), sort_keys=True, separators=(",", ":")).encode()).digest()


def compute_policy_digest(policy: SpotcheckPolicy) -> bytes:
    """Return sha256 of the policy's canonical JSON: the thresholds the verdict was decided under."""
    return hashlib.sha256(policy.model_dump_json().encode()).digest()


def get_reason(verdict: WindowVerdict) -> SpotReason:
    """Return the verdict's reason: the highest-precedence failure (wrong answers before timing)."""
    failures = set(verdict.failures)
    return next((reason for reason in SpotReason if reason.name.lower() in failures), SpotReason.OK)


def to_window_decision(verdict: WindowVerdict, m: WindowMeasurement, policy: SpotcheckPolicy,
                       run_id: str) -> WindowDecision:
    """Return the decision to sign for one window."""
    return WindowDecision(compute_run_key(run_id),
                          compute_window_id(run_id, verdict.device_id, verdict.window).to_bytes(32, "big"),
                          verdict.passed, int(get_reason(verdict)), compute_measurement_root(m),
                          compute_policy_digest(policy))


def to_verdict_record(decision: WindowDecision) -> VerdictRecord:
    """Return the slashing-protection record of a window decision (Store.record_verdict before signing)."""
    return VerdictRecord(int.from_bytes(decision.window_key, "big"), "0x" + decision.measurement_root.hex(),
                         decision.valid, decision.reason, "0x" + decision.policy_digest.hex(), 0)


def process_sign_window(store: Store, account: LocalAccount, chain_id: int, contract: str, operator: str,
                        decision: WindowDecision) -> WindowVote:
    """Record the decision (synced; ConflictingVerdict if this window was decided otherwise), then sign the vote."""
    record = store.record_verdict(to_verdict_record(decision))
    return sign_window_vote(account, chain_id, contract, operator, decision.run_key,
                            record.inference_id.to_bytes(32, "big"), record.valid, record.reason,
                            bytes.fromhex(record.artifact_root[2:]), bytes.fromhex(record.scores_digest[2:]))

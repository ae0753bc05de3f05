"""Reason codes and the root of verinfer's exception tree.

The root lives here, in the pure protocol package, so that protocol code can raise typed errors
without importing anything outside ``node.protocol``; ``node.errors`` re-exports it and adds the
adapter-level branches (recoverable, fatal).
"""

from __future__ import annotations

from enum import IntEnum


class Reason(IntEnum):
    """Why something was rejected; uint16 on the wire and on chain (Verdict.reason)."""

    OK = 0

    # Sampling parameters and inputs to the sampler (1xx).
    INVALID_TEMPERATURE = 100
    INVALID_TOP_P = 101
    INVALID_TOP_K = 102
    INVALID_K = 103
    NON_FINITE_LOGITS = 104
    VOCAB_TOO_LARGE = 105
    OUT_OF_RANGE = 106
    NON_FINITE_HIDDEN = 107
    UNKNOWN_MODEL = 108
    UNKNOWN_SAMPLER = 109  # a model registered with a sampler mode this node does not implement

    # Artifact decoding (2xx).
    WIRE_TOO_LARGE = 200
    WIRE_MALFORMED = 201
    ARTIFACT_TOO_LARGE = 202
    TRUNCATED = 203
    TRAILING_BYTES = 204
    LIMIT_EXCEEDED = 205
    BAD_POSITION_INDEX = 206
    NON_FINITE_LOGPROB = 207
    NON_CANONICAL = 208
    FINGERPRINT_MALFORMED = 209
    FINGERPRINT_LENGTH_MISMATCH = 210
    # Protocol v2 fingerprints (node.protocol.projection): a blob of another kind, projection seed or shape
    # than the one the request and the model's registration fix, or a kind the model is not registered for.
    FINGERPRINT_KIND_MISMATCH = 211
    FINGERPRINT_SEED_MISMATCH = 212
    FINGERPRINT_KIND_NOT_REGISTERED = 213

    # Stage 1, header and commitments (3xx).
    SEED_MISMATCH = 300
    MODEL_MISMATCH = 301
    PARAMS_MISMATCH = 302
    K_MISMATCH = 303
    OUTPUT_LENGTH_MISMATCH = 304
    OUTPUT_TOO_LONG = 305
    OUTPUT_HASH_MISMATCH = 306
    ARTIFACT_ROOT_MISMATCH = 307
    PROMPT_MISMATCH = 308
    # No payload for the commitment from the operator within the check window (its endpoints unreachable or
    # answering "unknown"): an unavailability verdict, kept apart from a payload that contradicts the commitment.
    PAYLOAD_UNAVAILABLE = 309

    # Stage 1, per position (4xx): the same codes the contract's fraud proof uses.
    CANDIDATE_ID_OUT_OF_RANGE = 400
    DUPLICATE_TOKEN_ID = 401
    WEIGHT_OUT_OF_RANGE = 402
    WEIGHTS_NOT_SORTED = 403
    WEIGHT_SUM_OVERFLOW = 404
    CHOSEN_OUT_OF_RANGE = 405
    CHOSEN_MISMATCH = 406
    TAIL_TOKEN_IN_CANDIDATES = 407
    # The termination rule (docs/security.md rule 3), per position like the sampler's; 305 is its header-level code.
    NOT_TERMINATED = 408
    TOKENS_AFTER_STOP = 409

    # Stage 2 decisions (5xx).
    FINGERPRINT_EXPONENT_MISMATCH = 500
    FINGERPRINT_MANTISSA_MEAN = 501
    FINGERPRINT_MANTISSA_MEDIAN = 502
    FINGERPRINT_SIGN_MISMATCH = 503
    WEIGHT_ERROR = 504
    SAMPLER_MARGIN = 505
    LOGPROB_DISTANCE = 506
    CANDIDATE_MISMATCH = 507
    SURPRISAL = 508
    DISTANCE2 = 509
    TEMPERATURE_FIT = 510
    TOP_P_FIT = 511
    FINGERPRINT_PROJECTION_DISTANCE = 512
    # The stock-sampler check (node.checks.stock_decision; a model registered with sampler = "vllm-seeded").
    TOKEN_DIFR = 520  # mean Token-DiFR margin over the profile's threshold
    TOKEN_DIFR_MAX = 521  # one position's Token-DiFR margin over the profile's threshold

    # 6xx: node operation (typed errors of the daemon; never the reason of a signed verdict)
    STORE_LOCKED = 600
    STORE_MISMATCH = 601
    CONFLICTING_VERDICT = 602
    CORRUPTED_ENTRY = 603
    DEEP_REORG = 604
    CHAIN_UNAVAILABLE = 605
    TX_FAILED = 606

    # 7xx: training verification (node.protocol.ledger.TrainingReason has the same codes; Training.sol verdicts)
    LEDGER_NOT_CHAINED = 700
    LEDGER_STEP_GAP = 701
    LEDGER_MALFORMED = 702
    CHECKPOINT_SHAPE = 703
    CHECKPOINT_DTYPE = 704
    CHECKPOINT_NON_FINITE = 705
    CHECKPOINT_POSITIONS = 706
    BATCH_ROOT_MISMATCH = 707
    NONCE_REPLAYED = 708
    RECOMPUTE_MISMATCH = 709
    LSH_MISMATCH = 710
    INIT_DISTRIBUTION = 711
    LATE_RESPONSE = 712
    DATA_UNDECLARED = 713
    CHECKPOINT_MISSING = 714
    SCHEDULE_MISMATCH = 715  # the ledger's learning rate is not the declared schedule's
    STATE_ROOT_MISMATCH = 716  # a served training state is not the one the ledger's state root binds

    # 8xx: memory spot checks (a window verdict's reason; node.spotcheck.onchain.SpotReason has the same codes)
    SPOT_WRONG_LABELS = 800
    SPOT_WRONG_STATE = 801
    SPOT_STALE_STATE = 802
    SPOT_UNKNOWN_STEP = 803
    SPOT_CAPACITY = 804
    SPOT_LATE = 805
    SPOT_MISSING = 806
    SPOT_TOO_FEW_CHALLENGES = 807
    SPOT_IDLE_CAPACITY = 808  # declared work left more of the catalogued compute unused than the calibrated slack
    SPOT_FABRICATED_STEP = 809  # a recorded declared step whose token its replayed logits do not give

    # 9xx: mixture-of-experts duties (node.protocol.moe.MoeReason has the same codes)
    MOE_MALFORMED = 900
    EXPERT_UNKNOWN = 901
    EXPERT_INPUT_HASH_MISMATCH = 902
    EXPERT_FINGERPRINT_MISMATCH = 903
    EXPERT_ROOT_MISMATCH = 904
    ROUTER_MISMATCH = 905
    ROUTING_INCOMPLETE = 906
    EXPERT_OUTPUT_HASH_MISMATCH = 907
    LINK_MISMATCH = 908
    ASSIGNMENT_UNCOVERED = 909
    DUTY_DATA_UNAVAILABLE = 910


class VerinferError(Exception):
    """Root of every error verinfer raises on purpose."""

    def __init__(self, message: str, reason: Reason = Reason.OK) -> None:
        super().__init__(message)
        self.reason = reason


class InvalidInput(VerinferError):
    """Input that can never become valid (bad artifact, bad params): reject it, keep running."""

    def __init__(self, message: str, reason: Reason, position: int | None = None) -> None:
        super().__init__(message, reason)
        self.position = position

    def __str__(self) -> str:
        where = "" if self.position is None else f" at position {self.position}"
        return f"{self.reason.name}{where}: {self.args[0]}"


class InvalidParams(InvalidInput):
    """Sampling parameters or sampler inputs outside the protocol's domain."""


class InvalidArtifact(InvalidInput):
    """An artifact that is truncated, oversized, non-canonical or otherwise malformed."""

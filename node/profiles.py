"""Model profiles (config/profiles/<model>.<dtype>.toml): calibrated thresholds, loaded at the edge."""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

from node.checks.decision import Stage2Thresholds
from node.checks.fingerprint import FingerprintThresholds
from node.checks.projection import ProjectionThresholds
from node.checks.stock_decision import StockThresholds
from node.engines.models import REPO_ROOT, ModelSpec, get_model_spec, materialise_model
from node.errors import FatalError, Reason
from node.protocol.hashing import keccak256
from node.protocol.projection import LAST_HIDDEN

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from chain.contracts import Hub

WAD = 10**18


class ProfileMeta(BaseModel):
    """Where a profile's numbers come from."""

    model_config = ConfigDict(extra="allow")

    model: str
    dtype: str
    calibrated: bool
    source: str


class FingerprintSection(BaseModel):
    """Fingerprint thresholds as written in the profile."""

    model_config = ConfigDict(extra="forbid")

    max_exponent_mismatches: int
    max_mantissa_error_mean: float
    max_mantissa_error_median: float
    max_sign_mismatches: int


class ThresholdSection(BaseModel):
    """A section of thresholds with per-length overrides of its own thresholds (min positions → overrides)."""

    model_config = ConfigDict(extra="forbid")

    by_length: dict[int, dict[str, float]] = Field(default_factory=dict)

    @field_validator("by_length")
    @classmethod
    def _known_fields(cls, value: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
        """Check that every per-length override names a threshold of this section."""
        unknown = {k for overrides in value.values() for k in overrides} - set(cls.model_fields) - {"by_length"}
        if unknown or any(n < 1 for n in value):
            raise ValueError(f"by_length: unknown thresholds {sorted(unknown)} or a length below 1")
        return value


class Stage2Section(ThresholdSection):
    """Stage-2 thresholds as written by the calibration."""

    model_config = ConfigDict(extra="forbid")

    max_weight_error: float
    max_sampler_margin: float
    max_logprob_distance: float
    max_candidate_mismatch_rate: float
    max_surprisal_z: float
    max_distance2: float
    max_temperature_deviation: float = float("inf")  # absent in profiles calibrated before it was measured
    max_temperature_t: float = float("inf")
    max_kept_mass_shift: float = float("inf")
    max_kept_mass_score: float = float("inf")
    max_kept_mass_t: float = float("inf")


class ProjectionSourceSection(BaseModel):
    """One source's projection thresholds: flat and per length."""

    model_config = ConfigDict(extra="forbid")

    max_distance: float = Field(gt=0)
    by_length: dict[int, float] = Field(default_factory=dict)  # min generated positions → threshold

    @field_validator("by_length")
    @classmethod
    def _positive(cls, value: dict[int, float]) -> dict[int, float]:
        """Check that lengths are at least 1 and thresholds positive."""
        if any(n < 1 or t <= 0 for n, t in value.items()):
            raise ValueError("by_length: lengths must be >= 1 and thresholds > 0")
        return value

    def thresholds(self) -> ProjectionThresholds:
        """Return these thresholds for the decision."""
        return ProjectionThresholds(self.max_distance, dict(self.by_length))


class ProjectionSection(ProjectionSourceSection):
    """Projection-fingerprint (kind 1) thresholds: calibrated by scripts/calibrate_projection.py. The flat and
    per-length ones apply to every source without a [projection.by_source."<source>"] table of its own
    ("last" for the last hidden state, or a decoder layer's number)."""

    by_source: dict[str, ProjectionSourceSection] = Field(default_factory=dict)

    @field_validator("by_source")
    @classmethod
    def _sources(cls, value: dict[str, ProjectionSourceSection]) -> dict[str, ProjectionSourceSection]:
        """Check that every key names a source: "last" or a decoder layer number below 255."""
        if any(k != "last" and not (k.isdigit() and int(k) < LAST_HIDDEN) for k in value):
            raise ValueError('by_source: keys are "last" or a decoder layer number')
        return value

    def thresholds(self) -> ProjectionThresholds:
        """Return the thresholds for the decision, each source's own where the profile has them."""
        by_source = {LAST_HIDDEN if k == "last" else int(k): v.thresholds() for k, v in self.by_source.items()}
        return ProjectionThresholds(self.max_distance, dict(self.by_length), by_source)


class StockSection(ThresholdSection):
    """Stock-sampler thresholds (a model registered with sampler = "vllm-seeded"): scripts/calibrate_stock.py."""

    model_config = ConfigDict(extra="forbid")

    max_difr_mean: float
    max_difr_max: float
    max_surprisal_z_abs: float


class ModelProfile(BaseModel):
    """A whole profile file: fingerprint thresholds and stage 2's once calibrated, or a stock sampler's."""

    model_config = ConfigDict(extra="allow")

    meta: ProfileMeta
    fingerprint: FingerprintSection | None = None  # absent for a stock sampler (stock engines commit none)
    stage2: Stage2Section | None = None
    projection: ProjectionSection | None = None
    stock: StockSection | None = None

    def stock_thresholds(self) -> StockThresholds:
        """Return the stock-sampler thresholds, or raise if this profile has none."""
        if self.stock is None:
            raise FatalError(f"profile for {self.meta.model} has no [stock] section: run scripts/calibrate_stock.py",
                             Reason.UNKNOWN_SAMPLER)
        by_length = tuple((n, tuple(sorted(o.items()))) for n, o in sorted(self.stock.by_length.items()))
        return StockThresholds(self.stock.max_difr_mean, self.stock.max_difr_max, self.stock.max_surprisal_z_abs,
                               by_length)

    def projection_thresholds(self) -> ProjectionThresholds | None:
        """Return the projection-fingerprint thresholds, or None if this profile has none (kind 1 not calibrated)."""
        if self.projection is None:
            return None
        return self.projection.thresholds()

    def fingerprint_thresholds(self) -> FingerprintThresholds:
        """Return the fingerprint thresholds for the decision (a profile without them is a stock sampler's)."""
        if self.fingerprint is None:
            raise FatalError(f"profile for {self.meta.model} has no [fingerprint] section (a stock-sampler profile)",
                             Reason.UNKNOWN_SAMPLER)
        return FingerprintThresholds(**self.fingerprint.model_dump())

    def stage2_thresholds(self) -> Stage2Thresholds:
        """Return stage 2's thresholds, or raise if this profile was never calibrated for them."""
        if self.stage2 is None:
            raise FatalError(f"profile for {self.meta.model} has no [stage2] section: run `verinfer calibrate`",
                             Reason.UNKNOWN_MODEL)
        flat = self.stage2.model_dump(exclude={"by_length"})
        by_length = tuple((n, tuple(sorted(o.items()))) for n, o in sorted(self.stage2.by_length.items()))
        return Stage2Thresholds(fingerprint=self.fingerprint_thresholds(), by_length=by_length, **flat)


def load_profile(spec: ModelSpec) -> tuple[Path, ModelProfile]:
    """Return the profile file of a model spec and its parsed content."""
    path = REPO_ROOT / spec.profile
    try:
        with path.open("rb") as f:
            profile = ModelProfile.model_validate(tomllib.load(f))
    except (OSError, tomllib.TOMLDecodeError, ValueError) as exc:
        raise FatalError(f"cannot load profile {path}: {exc}", Reason.UNKNOWN_MODEL) from exc
    if profile.projection is not None and profile.projection.by_source:
        registered = {str(x) for x in spec.projection.layers} if spec.projection is not None else set()
        if not set(profile.projection.by_source) <= registered:
            raise FatalError(f"profile {path} has projection thresholds for sources "
                             f"{sorted(profile.projection.by_source)} but {spec.name} registers {sorted(registered)}",
                             Reason.UNKNOWN_MODEL)
    return path, profile


class UncalibratedProfile(FatalError):
    """A model whose profile has no measured rates cannot be registered (run `verinfer calibrate` first)."""


@dataclass(frozen=True)
class Registration:
    """What the contract's registry holds of a model: id, K, vocabulary, α, β (1e18), profile hash, stop tokens."""

    model_id: bytes
    k: int
    vocab_size: int
    alpha: int
    beta: int
    profile_hash: bytes
    stop_tokens: tuple[int, ...]

    def register(self, hub: Hub, account: LocalAccount, min_check_rate: int, min_fee: int) -> None:
        """Register this model on the hub."""
        hub.register_model(account, self.model_id, self.k, self.vocab_size, self.alpha, self.beta, min_check_rate,
                           self.profile_hash, self.stop_tokens, min_fee)


def model_registration(name: str) -> Registration:
    """Return the registration of a registry model from its spec and calibrated profile."""
    spec = get_model_spec(name)
    profile_path = REPO_ROOT / spec.profile
    raw = profile_path.read_bytes()
    rates = tomllib.loads(raw.decode()).get("rates")
    if not rates:
        raise UncalibratedProfile(f"{profile_path} is not calibrated (no [rates]): run `verinfer calibrate`")
    alpha = max(float(rates["alpha_upper_95"]), 1e-6)  # the upper bound: an honest operator's benefit of doubt
    beta = max(rates.get("beta_64_tokens", {}).values(), default=0.0)  # the hardest attack measured
    files = materialise_model(spec)
    return Registration(files.model_id, spec.k, spec.vocab_size, math.ceil(alpha * WAD),
                        min(math.ceil(beta * WAD), WAD - 1), keccak256(raw), tuple(sorted(spec.stop_token_ids)))

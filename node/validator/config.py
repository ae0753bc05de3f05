"""The validator's configuration: a TOML file overlaid by VERINFER_* environment variables (pydantic-settings)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


class MoeServiceConfig(BaseModel):
    """The `[moe]` section of a validator's config: the module, the model and the duties this validator holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    module: str = Field(description="ExpertDuty module address")
    model: str = Field(description="registry name of the MoE model")
    experts: tuple[str, ...] = Field(min_length=1, max_length=4096,
                                     description="duties held: layer<L>.e<E>, layer<L>.router, shared")
    start_block: int = Field(0, ge=0)
    fetch_retries: int = Field(5, ge=1)
    attempts: int = Field(30, ge=1, description="tries of a job before it is given up")

    @field_validator("experts")
    @classmethod
    def _canonical_and_distinct(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from node.protocol.moe import ExpertKey, InvalidMoe

        try:
            keys = [ExpertKey.parse(name) for name in value]
        except InvalidMoe as e:
            raise ValueError(str(e)) from None
        if len(set(keys)) != len(keys):
            raise ValueError("experts repeat a duty")
        return value


class ValidatorConfig(BaseSettings):
    """Everything `verinfer validator run` needs."""

    model_config = SettingsConfigDict(env_prefix="VERINFER_", env_nested_delimiter="__", extra="forbid")

    rpc_url: str = "http://127.0.0.1:8545"
    ws_url: str | None = None
    chain_id: int
    contract: str
    start_block: int = 0
    data_dir: Path = Path("data/validator")
    keystore: Path
    password_file: Path | None = None
    models: list[str] = Field(default_factory=lambda: ["smollm2-135m-instruct"])
    executers: dict[str, str] = Field(default_factory=dict, description="operator address -> executer URL (HTTP)")
    peers: dict[str, str] = Field(default_factory=dict,
                                  description="address (operator or validator) -> libp2p multiaddr with /p2p/<id>")
    p2p_listen: str | None = Field("/ip4/127.0.0.1/tcp/0", description="libp2p listen multiaddr; None: off")
    p2p_key: Path | None = Field(None, description="libp2p peer key file (default: data_dir/peer.key)")
    gossip: bool = Field(True, description="gossip signed verdicts; the first committee member submits a quorum")
    submit_grace: float = Field(5.0, ge=0, description="seconds the other members wait before submitting")
    confirmations: int = Field(2, ge=0)
    safety_window: int = Field(64, ge=4)
    poll_interval: float = Field(1.0, gt=0)
    fetch_timeout: float = Field(10.0, gt=0)
    stage2_backend: Literal["torch", "iree"] = Field("torch", description="what computes stage 2's prefill of a "
                                                     "canonical-sampler model: transformers (torch), or the "
                                                     "validator's own verification graph replayed with IREE (same "
                                                     "profile and decision; docs/workload.md)")
    verify_batch: int = Field(1, ge=1, le=32, description="checks run at once; their prefills of one model share "
                              "one batched forward pass (1: one inference at a time)")
    batch_wait: float = Field(0.02, ge=0, le=1, description="seconds a prefill waits for others to join its batch")
    fetch_retries: int = Field(5, ge=1)
    unavailable_margin_blocks: int = Field(20, ge=1, description="a payload nobody serves is asked for again until "
                                           "this many blocks of its check window are left; then the vote says "
                                           "PAYLOAD_UNAVAILABLE (room for the vote to be gossiped and mined)")
    unavailable_retry_delay: float = Field(5.0, gt=0, description="longest wait (s) between two rounds of asking for "
                                           "a payload not served yet")
    check_attempts: int = Field(3, ge=1, description="tries of a check that fails unexpectedly (a bug, not the "
                                "chain or a peer) before the job is given up; transient failures retry until the "
                                "check window closes")
    retry_max_delay: float = Field(30.0, gt=0, description="longest back-off (s) between retries of a check or a "
                                   "submission")
    health_interval: float = Field(1.0, gt=0, description="seconds between two /health probes of the RPC and cursor")
    health_rpc_timeout: float = Field(2.0, gt=0, description="seconds a /health probe waits for the RPC")
    health_rpc_grace: float = Field(6.0, gt=0, description="seconds without a successful chain read before /health "
                                    "says rpc_unreachable")
    health_max_lag_blocks: int = Field(12, ge=0, description="blocks the event cursor may trail the head (beyond the "
                                       "confirmations) ...")
    health_stall_seconds: float = Field(20.0, gt=0, description="... for this long without moving, before /health "
                                        "says cursor_stalled")
    verdict_ttl: int = Field(3600, gt=0, description="seconds a signed verdict stays valid")
    recent_blocks_guard: int = Field(64, ge=0, description="blocks scanned at start for verdicts of another instance")
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(9464, ge=0, le=65535)
    moe: MoeServiceConfig | None = Field(None, description="MoE duties (ExpertDuty module): the experts held")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Environment variables win over the TOML file's values (passed as init arguments)."""
        return env_settings, init_settings


def load_config(path: Path | None, **overrides: Any) -> ValidatorConfig:
    """Return the config from a TOML file (optional) with environment variables and overrides on top."""
    values: dict[str, Any] = tomllib.loads(path.read_text()) if path else {}
    values.update(overrides)
    return ValidatorConfig(**values)

"""The whole loop on real processes, small: honest and cheating devices, the pinger, the record, the verifier."""

import pytest
from typer.testing import CliRunner

from node.cli_spotcheck import spotcheck_app
from node.spotcheck.sim import SimConfig, SimDeviceSpec, run_sim
from node.spotcheck.workload import SMOL_NAME


def test_a_small_cluster_flags_exactly_the_cheaters(tmp_path):
    roster = (SimDeviceSpec(device_id="honest"),
              SimDeviceSpec(device_id="evict-half", behaviour="evict", evict_fraction=0.5),
              SimDeviceSpec(device_id="far", behaviour="far_state", far_delay_ms=1000),
              SimDeviceSpec(device_id="stale", behaviour="stale", stale_every=8))
    # windows of ≈ 24 challenges: the late tolerance at the measured honest late rate is then 3, and the far
    # device is late on every state challenge (≈ 12 per window); 3-s windows gave it too few to tell from a stall
    config = SimConfig(devices=roster, arena_mib=2, layers=4, run_s=12, window_s=6, rate_hz=4, cpu_hog=False)
    assert config.get_policy().max_late == 3
    events = []
    result = run_sim(config, tmp_path, lambda kind, payload: events.append(kind))
    by_id = {d.device_id: d for d in result.devices}
    assert not by_id["honest"].flagged, by_id["honest"].verdicts
    assert "wrong_labels" in {f for v in by_id["evict-half"].verdicts for f in v.failures}
    assert "late" in {f for v in by_id["far"].verdicts for f in v.failures}
    assert "wrong_state" in {f for v in by_id["stale"].verdicts for f in v.failures}
    assert result.ok and {"ready", "exchange", "verdict"} <= set(events)
    assert result.feasibility["inputs"]["z_min_s"] > 0


def test_undeclared_compute_in_the_gaps_is_caught_by_the_declared_throughput_check(tmp_path):
    """Issue 31 finding 5: declared steps + undeclared compute between them, every answer right and in time.

    The gaps device spends 90 % of its compute on undeclared inference (the review: 51–56 s of 60 s) and its
    answers pass; the fabricate device does the same but records fake steps for the time it spent on
    undeclared work (so its declared work looks full) and computes a state only when a challenge asks.
    """
    roster = (SimDeviceSpec(device_id="honest"), SimDeviceSpec(device_id="honest-gc", gc_pressure=True),
              SimDeviceSpec(device_id="gaps", behaviour="gaps", gaps_fraction=0.9),
              SimDeviceSpec(device_id="fabricate", behaviour="fabricate", gaps_fraction=0.5))
    config = SimConfig(devices=roster, arena_mib=2, layers=4, run_s=12, window_s=6, rate_hz=4, cpu_hog=False)
    assert config.get_policy().min_utilisation > 0
    result = run_sim(config, tmp_path, lambda kind, payload: None)
    by_id = {d.device_id: d for d in result.devices}
    for honest in ("honest", "honest-gc"):
        assert not by_id[honest].flagged, [(v.failures, m.utilisation) for v, m in zip(
            by_id[honest].verdicts, by_id[honest].measurements, strict=True)]
    gaps = by_id["gaps"]
    assert all(v.failures == ("idle_capacity",) for v in gaps.verdicts), gaps.verdicts  # its answers all pass
    assert all(m.utilisation < config.min_utilisation for m in gaps.measurements)
    fabricate = by_id["fabricate"]
    assert all("fabricated_step" in v.failures for v in fabricate.verdicts), fabricate.verdicts
    assert all(m.fabricated_steps > 0 for m in fabricate.measurements)
    assert result.ok


def test_on_chain_three_validators_slash_exactly_the_cheaters_operator(tmp_path):
    roster = (SimDeviceSpec(device_id="honest"),
              SimDeviceSpec(device_id="evict-half", behaviour="evict", evict_fraction=0.5))
    config = SimConfig(devices=roster, arena_mib=2, layers=4, run_s=4, window_s=2, rate_hz=4, cpu_hog=False)
    result = run_sim(config, tmp_path, lambda kind, payload: None, chain=True)
    outcomes = {o.device_id: o for o in result.chain}
    assert outcomes["evict-half"].slashed and outcomes["evict-half"].jailed and 2 in outcomes["evict-half"].windows
    assert not outcomes["honest"].slashed and not outcomes["honest"].jailed
    assert outcomes["honest"].windows and set(outcomes["honest"].windows) == {1}
    assert result.chain_ok and result.ok
    stores = list((tmp_path / "validators" / result.run_id).iterdir())
    assert len(stores) == 3  # each validator recorded its decisions before signing


@pytest.mark.e2e
def test_the_sim_command_catches_every_cheater_of_the_default_roster(tmp_path):
    result = CliRunner().invoke(spotcheck_app, ["sim", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "spotcheck-sim.json").exists() and (tmp_path / "detection.png").exists()


def test_smollm2_devices_run_real_decode_steps_and_replay_bit_identically(tmp_path):
    roster = (SimDeviceSpec(device_id="smol", model=SMOL_NAME, state_tokens=16),
              SimDeviceSpec(device_id="smol-stale", model=SMOL_NAME, state_tokens=16, behaviour="stale",
                            stale_every=4))
    config = SimConfig(devices=roster, arena_mib=2, layers=4, run_s=4, window_s=4, rate_hz=4, cpu_hog=False,
                       step_interval_ms=200)
    result = run_sim(config, tmp_path, lambda kind, payload: None)
    by_id = {d.device_id: d for d in result.devices}
    honest = by_id["smol"]
    assert not honest.flagged, honest.verdicts
    quanta = [q for m in honest.measurements for q in m.state_quanta]
    assert quanta and max(quanta) == 0  # the verifier's replay of SmolLM2 steps is bit-identical
    assert honest.steps >= 3  # real SmolLM2 steps (≈ 100 ms idle; seconds each on a loaded machine)
    assert "wrong_state" in {f for v in by_id["smol-stale"].verdicts for f in v.failures}
    assert result.ok

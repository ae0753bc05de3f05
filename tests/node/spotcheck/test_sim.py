"""The whole loop on real processes, small: honest and cheating devices, the pinger, the record, the verifier."""

import pytest
from typer.testing import CliRunner

from node.cli_spotcheck import spotcheck_app
from node.spotcheck.sim import SimConfig, SimDeviceSpec, run_sim


def test_a_small_cluster_flags_exactly_the_cheaters(tmp_path):
    roster = (SimDeviceSpec(device_id="honest"),
              SimDeviceSpec(device_id="evict-half", behaviour="evict", evict_fraction=0.5),
              SimDeviceSpec(device_id="far", behaviour="far_state", far_delay_ms=1000),
              SimDeviceSpec(device_id="stale", behaviour="stale", stale_every=8))
    config = SimConfig(devices=roster, arena_mib=2, layers=4, run_s=6, window_s=3, rate_hz=4, cpu_hog=False)
    events = []
    result = run_sim(config, tmp_path, lambda kind, payload: events.append(kind))
    by_id = {d.device_id: d for d in result.devices}
    assert not by_id["honest"].flagged, by_id["honest"].verdicts
    assert "wrong_labels" in {f for v in by_id["evict-half"].verdicts for f in v.failures}
    assert "late" in {f for v in by_id["far"].verdicts for f in v.failures}
    assert "wrong_state" in {f for v in by_id["stale"].verdicts for f in v.failures}
    assert result.ok and {"ready", "exchange", "verdict"} <= set(events)
    assert result.feasibility["inputs"]["z_min_s"] > 0


@pytest.mark.e2e
def test_the_sim_command_catches_every_cheater_of_the_default_roster(tmp_path):
    result = CliRunner().invoke(spotcheck_app, ["sim", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "spotcheck-sim.json").exists() and (tmp_path / "detection.png").exists()

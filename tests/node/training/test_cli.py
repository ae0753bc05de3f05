import json

from typer.testing import CliRunner

from node.cli_training import training_app


def test_the_sub_app_lists_its_commands():
    result = CliRunner().invoke(training_app, ["--help"])
    assert result.exit_code == 0
    for command in ("audit", "calibrate", "trajectory", "attacks", "devnet"):
        assert command in result.output


def test_audit_refuses_to_start_without_a_key(tmp_path, monkeypatch):
    monkeypatch.delenv("VERINFER_TEST_KEY", raising=False)
    config = tmp_path / "a.json"
    config.write_text(json.dumps({"rpc": "http://127.0.0.1:1", "contract": "0x" + "00" * 20, "runs": [],
                                  "journal": str(tmp_path / "j"), "timeout_s": 1}))
    result = CliRunner().invoke(training_app, ["audit", "--config", str(config), "--key-env", "VERINFER_TEST_KEY"])
    assert result.exit_code != 0 and "VERINFER_TEST_KEY" in result.output

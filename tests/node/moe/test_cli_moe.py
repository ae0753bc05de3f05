"""`verinfer moe` sub-app on the tiny MoE (typer's CliRunner)."""

from typer.testing import CliRunner

from node.cli_moe import moe_app


def test_generate_commits_and_checks_one_expert():
    result = CliRunner().invoke(moe_app, ["generate", "Hi!", "--model", "tiny-moe", "--max-tokens", "4",
                                          "--expert", "layer1.e0"])
    assert result.exit_code == 0, result.output
    assert "moeRoot" in result.output and '"key": "layer1.e0"' in result.output


def test_a_bad_expert_name_is_a_typed_rejection_with_exit_2():
    result = CliRunner().invoke(moe_app, ["generate", "Hi!", "--model", "tiny-moe", "--expert", "layer1.x9"])
    assert result.exit_code == 2
    assert "layer1.x9" in result.output


def test_attack_command_exits_1_when_a_duty_rejects_and_0_when_honest():
    runner = CliRunner()
    cheat = runner.invoke(moe_app, ["attack", "int8-expert", "--model", "tiny-moe", "--expert", "layer1.e0", "--json"])
    assert cheat.exit_code == 1, cheat.output
    assert '"expert": "EXPERT_FINGERPRINT_MISMATCH"' in cheat.output
    honest = runner.invoke(moe_app, ["attack", "honest", "--model", "tiny-moe", "--expert", "layer1.e0"])
    assert honest.exit_code == 0, honest.output

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

from typer.testing import CliRunner

from node.cli import app
from node.errors import Reason
from node.selfcheck import run_protocol_selfcheck


def test_selfcheck_honest_passes_and_every_forgery_is_caught():
    report = run_protocol_selfcheck(output_length=32, vocab_size=2000)
    assert report.ok
    by_name = {c.name: c.result for c in report.cases}
    assert by_name["honest"].valid
    assert sum(not r.valid for r in by_name.values()) == len(report.cases) - 1
    assert by_name["another candidate chosen (recommitted)"].reason is Reason.CHOSEN_MISMATCH


def test_cli_protocol_demo_exits_zero_and_prints_the_table():
    result = CliRunner().invoke(app, ["protocol", "demo", "--tokens", "16", "--vocab", "500"])
    assert result.exit_code == 0, result.output
    assert "WEIGHTS_NOT_SORTED" in result.output and "self-check passed" in result.output

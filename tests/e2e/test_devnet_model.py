"""`verinfer devnet --model NAME` on a second model family: every cheater slashed, the honest operator paid."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from node.devnet.network import get_operator_kinds


@pytest.mark.e2e
@pytest.mark.slow  # two whole devnets of several minutes each: `bash scripts/test -m slow` (CI time, issue 34)
# gemma-3-270m: a base model, the requester sends completion prompts; the vllm-stock entry: a stock-sampler model
# (docs/protocol.md §13.1), operators commit the stock commitment and validators judge on Token-DiFR
@pytest.mark.parametrize("model", ["gemma-3-270m", "smollm2-135m-instruct-vllm-stock"])
def test_the_devnet_on_another_model_slashes_every_cheater_and_pays_the_honest_operator(tmp_path: Path,
                                                                                         model: str) -> None:
    out = tmp_path / "devnet"
    run = subprocess.run([sys.executable, "-m", "node.cli", "devnet", "--model", model, "--rounds", "6",
                          "--validators", "3", "--committee", "3", "--tokens", "16", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800)
    output = run.stdout.decode(errors="replace")
    (out / "stdout.txt").write_text(output)  # the live view's last frame and the event feed, for a look afterwards
    assert run.returncode == 0, output[-4000:]
    record = json.loads((out / "devnet.json").read_text())
    assert record["ok"] and record["options"]["model"] == model, record["problems"]
    operators = {o["kind"]: o for o in record["operators"]}
    assert set(operators) == set(get_operator_kinds(model))
    honest = operators.pop("honest")
    assert not honest["jailed"] and honest["requests"] == 6 and honest["valid"] == 6 and int(honest["earned_wei"]) > 0
    restarted = operators.pop("restarted")  # its executer went down right after a commit and came back on its store
    assert not restarted["jailed"] and restarted["requests"] == restarted["valid"] == 3, restarted
    for kind, cheater in operators.items():
        assert cheater["jailed"] and cheater["valid"] == 0 and cheater["invalid"] + cheater["fraud"] >= 1, kind
    assert all(i["status"] in ("VALID", "INVALID", "FRAUD") for i in record["inferences"])
    answers = [i for i in record["inferences"] if i["operator"] == "honest"]
    assert all(i["error"] is None for i in answers) and any(i["text"].strip() for i in answers)  # completions came back

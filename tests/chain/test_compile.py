"""The committed ABI + bytecode are what the pinned compiler makes of contracts/src today."""

from chain.compile import SOLC_VERSION, compile_artifacts, find_stale, load_version
from chain.contracts import load_artifact


def test_committed_artifacts_are_fresh():
    files = compile_artifacts()
    assert set(files) == {"Verinfer.json", "ProtocolViews.json", "Training.json", "SpotCheck.json", "ExpertDuty.json"}
    assert find_stale(files) == [], "run `python -m chain.compile` and commit chain/artifacts/"


def test_the_compiler_is_the_pinned_solc_js():
    assert load_version().startswith(f"{SOLC_VERSION}+")
    art = load_artifact()
    assert art["settings"]["evmVersion"] == "cancun"
    runtime = bytes.fromhex(art["deployedBytecode"][2:])
    assert 10_000 < len(runtime) <= 24_576, "EIP-170: deployed code must fit 24,576 bytes"

"""Compile contracts/src with the pinned solc-js and write ABI + bytecode under chain/artifacts/.

``python -m chain.compile`` writes; ``python -m chain.compile --check`` fails if the committed
artifacts differ from a fresh compile (CI runs the check as a test). The compiler is npm
``solc@0.8.28`` through ``contracts/solc-shim.js`` (the same shim forge and slither use).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from chain.errors import ArtifactsStale, ChainError, ToolMissing

REPO_ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = REPO_ROOT / "contracts"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
SOLC_VERSION = "0.8.28"
DEPLOYED = ("Verinfer", "ProtocolViews", "Training", "SpotCheck", "ExpertDuty")  # artifacts committed
SETTINGS: dict[str, Any] = {
    "evmVersion": "cancun",
    "viaIR": True,  # the hub fits EIP-170's 24,576 bytes only through the IR pipeline (25.6 KB without)
    "optimizer": {"enabled": True, "runs": 200},
    "remappings": ["@openzeppelin/contracts/=node_modules/@openzeppelin/contracts/"],
    "outputSelection": {"*": {"*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"]}},
}


def build_input() -> dict[str, Any]:
    """Return the solc standard-JSON input for every source under contracts/src."""
    sources = {str(p.relative_to(CONTRACTS)): {"content": p.read_text()}
               for p in sorted((CONTRACTS / "src").glob("*.sol"))}
    return {"language": "Solidity", "sources": sources, "settings": SETTINGS}


def _node() -> str:
    node = shutil.which("node")
    if node is None or not (CONTRACTS / "node_modules" / "solc").is_dir():
        raise ToolMissing("node and contracts/node_modules are needed: run `npm ci` in contracts/ (scripts/setup does)")
    return node


def load_version() -> str:
    """Return the solc-js version string behind the shim (e.g. 0.8.28+commit.7893614a...)."""
    done = subprocess.run([_node(), str(CONTRACTS / "solc-shim.js"), "--version"], cwd=CONTRACTS,
                          capture_output=True, text=True, check=True)
    return done.stdout.strip().rsplit("Version: ", 1)[-1]


def run_solc(standard_input: dict[str, Any]) -> dict[str, Any]:
    """Return solc-js's standard-JSON output, or raise with its errors."""
    if not load_version().startswith(f"{SOLC_VERSION}+"):
        raise ToolMissing(f"solc-js {SOLC_VERSION} expected, got {load_version()!r}")
    done = subprocess.run([_node(), str(CONTRACTS / "solc-shim.js"), "--standard-json"], cwd=CONTRACTS,
                          input=json.dumps(standard_input),
                          capture_output=True, text=True, check=True)
    out: dict[str, Any] = json.loads(done.stdout)
    errors = [e["formattedMessage"] for e in out.get("errors", []) if e.get("severity") == "error"]
    if errors:
        raise ChainError("solc failed:\n" + "\n".join(errors))
    return out


def compile_artifacts() -> dict[str, str]:
    """Return {file name: JSON text} of the artifacts a fresh compile produces."""
    out = run_solc(build_input())
    files = {}
    for source, contracts in out["contracts"].items():
        for name, c in contracts.items():
            if name in DEPLOYED:
                artifact = {"contractName": name, "sourceName": source, "compiler": f"solc-js {SOLC_VERSION}",
                            "settings": {k: v for k, v in SETTINGS.items() if k != "outputSelection"},
                            "abi": c["abi"], "bytecode": "0x" + c["evm"]["bytecode"]["object"],
                            "deployedBytecode": "0x" + c["evm"]["deployedBytecode"]["object"]}
                files[f"{name}.json"] = json.dumps(artifact, indent=1, sort_keys=True) + "\n"
    return files


def find_stale(files: dict[str, str]) -> list[str]:
    """Return the artifact names whose committed text differs from `files`."""
    return [name for name, text in files.items()
            if not (ARTIFACTS / name).exists() or (ARTIFACTS / name).read_text() != text]


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, verify) the committed artifacts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed artifacts are stale")
    args = parser.parse_args(argv)
    files = compile_artifacts()
    stale = find_stale(files)
    if args.check:
        if stale:
            raise ArtifactsStale(f"stale artifacts: {', '.join(stale)}; run `python -m chain.compile`")
        return 0
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (ARTIFACTS / name).write_text(text)
    sys.stderr.write(f"wrote {', '.join(sorted(files))} to {ARTIFACTS}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

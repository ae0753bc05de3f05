"""`verinfer devnet` is safe to interrupt: SIGINT or SIGTERM mid-run stops every process it started."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import plyvel
import psutil
import pytest

from node.devnet.network import OPERATOR_KINDS


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_devnet_leaves_no_process_and_no_locked_store(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "devnet"

    def as_a_background_job() -> None:  # a shell's background job inherits SIGINT ignored: it must still stop
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    devnet = subprocess.Popen([sys.executable, "-m", "node.cli", "devnet", "--rounds", "4", "--validators", "2",
                               "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True, preexec_fn=as_a_background_job)
    seen: dict[int, str] = {}  # every descendant, for the leftover check
    direct: dict[int, str] = {}  # the devnet's own children: anvil and the validators
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # wait until the traffic runs: anvil, validators and verdicts
            for child in _children(devnet.pid):
                with contextlib.suppress(psutil.Error):  # a child may end between listing and reading
                    # the latest: a child caught between fork and exec still shows its parent's command line
                    seen[child.pid] = " ".join(child.cmdline())
                    if child.ppid() == devnet.pid:
                        direct[child.pid] = seen[child.pid]
            log = (out / "devnet.log").read_text() if (out / "devnet.log").exists() else ""
            if "valid (P(spoofer)" in log:
                break
            assert devnet.poll() is None, devnet.stdout.read().decode() if devnet.stdout else ""
            time.sleep(0.5)
        else:
            pytest.fail("the devnet never got to its first verdict")
        assert any("anvil" in c for c in direct.values()) and sum("validator run" in c for c in direct.values()) == 2, \
            direct
        devnet.send_signal(sig)
        output, _ = devnet.communicate(timeout=90)
    finally:
        if devnet.poll() is None:
            os.killpg(devnet.pid, signal.SIGKILL)
    assert devnet.returncode == 130, output.decode()
    assert b"interrupted" in output
    left = [f"{pid}: {cmd}" for pid, cmd in seen.items() if psutil.pid_exists(pid)
            and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not left, left
    stores = sorted(out.glob("nodes/*/data"))
    assert len(stores) == len(OPERATOR_KINDS) + 2  # each operator's journal, two validators' stores
    for path in stores:  # every LevelDB was closed: its lock can be taken again
        plyvel.DB(str(path)).close()

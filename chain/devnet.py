"""A local anvil node: started on a free loopback port in its own process group, stopped cleanly.

The binary comes from npm ``@foundry-rs/anvil`` (installed in contracts/node_modules by
scripts/setup); ``VERINFER_ANVIL`` or an ``anvil`` on PATH override it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

from chain.errors import ChainUnavailable, NoFreePort, ToolMissing

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
NPM_ANVIL = REPO_ROOT / "contracts" / "node_modules" / "@foundry-rs" / "anvil-linux-amd64" / "bin" / "anvil"
DEV_MNEMONIC = "test test test test test test test test test test test junk"  # anvil's public dev mnemonic


def find_anvil() -> Path:
    """Return the anvil binary to run."""
    candidates = [os.environ.get("VERINFER_ANVIL"), str(NPM_ANVIL), shutil.which("anvil")]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    raise ToolMissing("anvil not found: run scripts/setup (npm @foundry-rs/anvil) or set VERINFER_ANVIL")


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORT_FLOOR = 20000
_issued_ports: set[int] = set()


def read_ephemeral_floor() -> int:
    """Return the lowest port the kernel hands to outgoing connections (32768 where unknown)."""
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def find_free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago and was not handed out before.

    Ports come from below the kernel's ephemeral range: a port bound to 0 is an ephemeral one, and
    between choosing it and the server binding it any outgoing connection (an RPC call, a libp2p
    dial) may take it as its source port.
    """
    ceiling = max(read_ephemeral_floor(), LISTEN_PORT_FLOOR + 1000)
    chooser = random.SystemRandom()
    for _ in range(200):
        port = chooser.randrange(LISTEN_PORT_FLOOR, ceiling)
        if port in _issued_ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _issued_ports.add(port)
        return port
    raise NoFreePort(f"no free TCP port on 127.0.0.1 in {LISTEN_PORT_FLOOR}..{ceiling - 1}")


def stop_process_group(p: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM a process started in its own session and its whole group; SIGKILL them after the grace period."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def dev_account(index: int) -> LocalAccount:
    """Return anvil's prefunded dev account `index` (public test keys, never for real funds)."""
    Account.enable_unaudited_hdwallet_features()
    account: LocalAccount = Account.from_mnemonic(DEV_MNEMONIC, account_path=f"m/44'/60'/0'/0/{index}")
    return account


class Anvil:
    """A running anvil process; use as a context manager or call start()/stop()."""

    def __init__(self, chain_id: int = 31337, accounts: int = 10, block_time: float | None = None,
                 log_path: Path | None = None) -> None:
        self.chain_id = chain_id
        self.accounts = accounts
        self.block_time = block_time
        self.log_path = log_path
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Return the HTTP RPC endpoint."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        """Return the WebSocket RPC endpoint."""
        return f"ws://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> Anvil:
        """Start anvil and wait until it answers eth_chainId."""
        binary = find_anvil()
        for _ in range(5):  # a port taken between probing and binding: try another
            self.port = find_free_port()
            cmd = [str(binary), "--host", "127.0.0.1", "--port", str(self.port), "--chain-id", str(self.chain_id),
                   "--accounts", str(self.accounts), "--mnemonic", DEV_MNEMONIC]
            if self.block_time:
                cmd += ["--block-time", str(self.block_time)]
            out = self.log_path.open("ab") if self.log_path else subprocess.DEVNULL
            self.process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
            if self._wait_ready(timeout):
                log.info("anvil started", extra={"url": self.url, "pid": self.process.pid})
                return self
            self.stop()
        raise ChainUnavailable("anvil did not start")

    def _wait_ready(self, timeout: float) -> bool:
        w3 = Web3(Web3.HTTPProvider(self.url, request_kwargs={"timeout": 1}))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                return False
            with contextlib.suppress(Exception):
                if w3.eth.chain_id == self.chain_id:
                    return True
            time.sleep(0.05)
        return False

    def stop(self, grace: float = 5.0) -> None:
        """Stop anvil and everything in its process group."""
        p, self.process = self.process, None
        if p is not None:
            stop_process_group(p, grace)

    def web3(self) -> Web3:
        """Return a Web3 connected over HTTP."""
        return Web3(Web3.HTTPProvider(self.url))

    def __enter__(self) -> Anvil:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

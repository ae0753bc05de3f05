"""Ethereum keystore v3 files (eth-account): create, import, unlock. Keys are never written or logged in clear."""

from __future__ import annotations

import json
import os
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount

from node.errors import FatalError, Reason


def read_password(password_file: Path | None = None, env: str = "VERINFER_KEYSTORE_PASSWORD") -> str:
    """Return the keystore password from a file (first line) or an environment variable."""
    if password_file is not None:
        return password_file.read_text().splitlines()[0] if password_file.read_text() else ""
    value = os.environ.get(env)
    if value is None:
        raise FatalError(f"no keystore password: give a password file or set {env}", Reason.OUT_OF_RANGE)
    return value


def write_keystore(path: Path, private_key: bytes, password: str) -> str:
    """Encrypt a private key into a keystore v3 file (mode 0600); return its address."""
    account: LocalAccount = Account.from_key(private_key)
    keystore = Account.encrypt(private_key, password)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(keystore, f)
    return str(account.address)


def create_keystore(path: Path, password: str) -> str:
    """Create a new random key in a keystore file; return its address."""
    return write_keystore(path, bytes(Account.create().key), password)


def unlock_keystore(path: Path, password: str) -> LocalAccount:
    """Return the account of a keystore file, or raise FatalError (wrong password, bad file)."""
    try:
        key = Account.decrypt(json.loads(path.read_text()), password)
    except (OSError, ValueError, KeyError) as exc:
        raise FatalError(f"cannot unlock {path}: {type(exc).__name__}", Reason.OUT_OF_RANGE) from exc
    account: LocalAccount = Account.from_key(key)
    return account

"""The Fernet box that seals every secret the service stores (channel tokens, MCP server and
HTTP tool header values): one key for all of them, so an operator rotates one thing."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.fernet import Fernet

if TYPE_CHECKING:
    from orchestrator.config import Settings

KEY_FILE = "channel_key"  # its first user's name, kept so existing deployments keep their key


def secret_box(configured: str | None, data_dir: Path) -> Fernet:
    """From `channel_secret_key` (any string: hashed to a key), else `<data_dir>/channel_key`
    (created, mode 0600, on first use)."""
    if configured:
        return Fernet(base64.urlsafe_b64encode(hashlib.sha256(configured.encode()).digest()))
    path = data_dir / KEY_FILE
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process made it first
        else:
            with os.fdopen(fd, "wb") as fh:
                fh.write(Fernet.generate_key() + b"\n")
    return Fernet(path.read_bytes().strip())


def configured_box(settings: Settings) -> Fernet:
    """The box of this deployment's settings."""
    key = settings.channel_secret_key
    return secret_box(key.get_secret_value() if key else None, settings.data_dir)

"""ddpctl's own SSH key pair for rented machines (~/.config/ddpctl/vast_ed25519): made once, private part 0600.

A key of its own, not the user's ~/.ssh keys: it is registered on the Vast.ai account and on every instance,
so it should open nothing else.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from launcher.errors import DdpctlError
from launcher.places.vast.apikey import ddpctl_key_file

KEY_NAME = "vast_ed25519"
COMMENT = "ddpctl-vast"


def vast_key_path() -> Path:
    """Where the private key lives (next to ddpctl's API key file; XDG_CONFIG_HOME honoured)."""
    return ddpctl_key_file().parent / KEY_NAME


def ensure_vast_ssh_key(path: Path | None = None) -> tuple[Path, str]:
    """The key pair at `path` (made if missing): returns the private key's path and the public key line."""
    private = path or vast_key_path()
    public = private.with_name(private.name + ".pub")
    if not private.exists():
        _generate(private, public)
    if private.stat().st_mode & 0o077:
        raise DdpctlError(f"{private} is readable by others: run `chmod 600 {private}` (it logs in to rented "
                          "machines)")
    try:
        return private, public.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise DdpctlError(f"{public} is missing: delete {private} and ddpctl makes a new pair") from None


def _generate(private: Path, public: Path) -> None:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                            serialization.NoEncryption())
    line = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    private.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # O_EXCL with mode 0600: never readable by others, and two launchers at once cannot both write it.
    tmp = private.with_name(f".{private.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        public.write_text(f"{line.decode()} {COMMENT}\n", encoding="utf-8")
        os.replace(tmp, private)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

"""The user's SSH keys as paramiko loads them, with the two mistakes named in one line each: a public key given
where the private one is needed, and a passphrase-protected key that no ssh-agent holds."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from launcher.errors import SpecError
from launcher.spec.user_paths import read_user_file
from launcher.transport.paramiko_loader import paramiko

KEY_MAX_BYTES = 1 << 20  # an RSA 16384-bit private key is about 12 KiB
_PUBLIC_PREFIXES = (b"ssh-", b"ecdsa-sha2-", b"sk-ssh-", b"sk-ecdsa-")


def is_public_key(path: str | Path) -> bool:
    """Whether the file is the public half of a key pair (`ssh-ed25519 AAAA... comment`, as `.pub` files are)."""
    try:
        head = read_user_file(path, "the key file", KEY_MAX_BYTES)[:64]
    except (OSError, SpecError):
        return False
    return head.startswith(_PUBLIC_PREFIXES)


def check_key_file(path: str | Path, what: str = "--identity-file") -> None:
    """Refuse (SpecError, one line) a key file that is not a regular file or is larger than any key: paramiko
    would read /dev/zero until memory runs out, and wait on a FIFO for ever."""
    try:
        read_user_file(path, what, KEY_MAX_BYTES, "give the path of a private key file (e.g. ~/.ssh/id_ed25519)")
    except (FileNotFoundError, NotADirectoryError):
        return  # named where the keys are loaded (not found)
    except OSError as e:
        raise SpecError(f"{what} {path}: cannot be read ({e.strerror or e})") from None


def check_identity_file(path: Path) -> None:
    """Refuse (SpecError) an --identity-file that is not a bounded regular file, or holds a public key (naming
    the private file to give instead)."""
    check_key_file(path)
    if not is_public_key(path):
        return
    text = str(path)
    private = text[: -len(".pub")] if text.endswith(".pub") else None
    instead = (f"give --identity-file {private}" if private and os.path.exists(private)
               else "give --identity-file the private key file (the one without .pub)")
    raise SpecError(f"--identity-file {text} is the public half of a key pair: {instead}")


class KeyLoad:
    """Loads identity files, keeping what went wrong with each for the authentication error."""

    def __init__(self) -> None:
        self.tried: list[str] = []
        self.encrypted: list[str] = []  # passphrase-protected files (usable only through ssh-agent)

    def files(self, paths: list[str], *, explicit: bool) -> Iterator[tuple[str, paramiko.PKey]]:
        """(path, key) for each file that loads; `explicit`: the user named them, so a missing one is reported."""
        for path in paths:
            if not os.path.exists(path):
                if explicit:
                    self.tried.append(f"{path} (not found)")
                continue
            try:
                check_key_file(path, "the identity file")
            except SpecError as e:
                if explicit:
                    raise
                self.tried.append(f"{path} ({str(e).rsplit(': ', 1)[0]})")
                continue
            if is_public_key(path):
                self.tried.append(f"{path} (a public key: give the private one)")
                continue
            try:
                yield path, paramiko.PKey.from_path(path)
            except (paramiko.SSHException, OSError, ValueError, TypeError) as e:
                # PKey.from_path passes on cryptography's TypeError for an encrypted key, not paramiko's exception.
                if isinstance(e, paramiko.PasswordRequiredException) or "password" in str(e).lower():
                    self.encrypted.append(path)
                    self.tried.append(f"{path} (passphrase-protected)")
                else:
                    self.tried.append(f"{path} (unreadable: {e})")

    def failure_hint(self) -> str:
        """What to do, when a passphrase-protected key was skipped (else the general hint)."""
        if self.encrypted:
            key = self.encrypted[0]
            return (f"{key} is protected by a passphrase and no ssh-agent holds it: run `ssh-add {key}` (or give "
                    "--identity-file an unencrypted key)")
        return "give one with --identity-file, IdentityFile in ~/.ssh/config, or ssh-agent"

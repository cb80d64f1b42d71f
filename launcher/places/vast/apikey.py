"""Where the Vast.ai API key comes from, and how `ddpctl vast login` stores it (mode 0600 from creation)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.places.vast.errors import ApiKeyMissing, VastError, VastNotFound
from launcher.results.rundir import write_bytes_atomic

if TYPE_CHECKING:
    from launcher.places.vast.client import VastClient

KEY_ENV = "VAST_API_KEY"


def vast_client() -> VastClient:
    """An API client with the saved (or $VAST_API_KEY) key, pacing its requests together with every other ddpctl
    process of this user (shared_pacing.py: Vast's limits count per key)."""
    from launcher.places.vast.client import VastClient

    return VastClient(load_api_key(), shared_pacing=True)


def _config_home() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")


def vastai_key_file() -> Path:
    """The key file of Vast's own CLI (vastai writes it without restricting its mode)."""
    return _config_home() / "vastai" / "vast_api_key"


def ddpctl_key_file() -> Path:
    """The key file `ddpctl vast login` writes."""
    return _config_home() / "ddpctl" / "vast_api_key"


def load_api_key() -> str:
    """The key from VAST_API_KEY, else vastai's key file, else ddpctl's (an empty file is passed over);
    ApiKeyMissing if none has one, or if VAST_API_KEY is set but empty (an empty key is never sent)."""
    if KEY_ENV in os.environ:
        env = os.environ[KEY_ENV].strip()
        if not env:
            raise ApiKeyMissing(f"{KEY_ENV} is set but empty: set it to your Vast.ai API key, or unset it to use "
                                "the key `ddpctl vast login` saved")
        return env
    for path in (vastai_key_file(), ddpctl_key_file()):
        try:
            key = path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ApiKeyMissing(f"cannot read the Vast.ai API key file {path}: {exc.strerror}") from None
        if key:
            return key
    raise ApiKeyMissing(
        f"no Vast.ai API key: set {KEY_ENV}, or run `ddpctl vast login` (writes {ddpctl_key_file()}), "
        f"or `vastai set api-key` (writes {vastai_key_file()})"
    )


def save_api_key(key: str, path: Path | None = None) -> Path:
    """Write the key atomically to ddpctl's key file (or `path`), readable by the owner only; returns it."""
    key = key.strip()
    if not key or any(c.isspace() for c in key):
        raise ApiKeyMissing("the Vast.ai API key is empty or contains whitespace; paste it again")
    target = path or ddpctl_key_file()
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Created 0600 (never readable by others, not even for an instant); the rename replaces an older key at once.
    write_bytes_atomic(target, (key + "\n").encode(), mode=0o600)
    return target


def delete_keys(client: VastClient, key_ids: list[int]) -> list[int]:
    """Delete the run's autostop keys from the account; returns the ids that could not be deleted."""
    left = []
    for key_id in key_ids:
        try:
            client.delete_api_key(key_id)
        except VastNotFound:
            pass
        except VastError:
            left.append(key_id)
    return left

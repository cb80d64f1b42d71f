"""The trainer's own error family: `python -m trainer` prints these as one line on stderr and exits 2."""

from __future__ import annotations


class TrainerError(Exception):
    """An error the user can fix (missing files, bad option, unusable snapshot); the message says how."""


class DataError(TrainerError):
    """A data set's files are missing, truncated or not in the expected format."""


class SnapshotError(TrainerError):
    """A snapshot file is corrupt, truncated or belongs to another run."""

"""Seed derivation shared by every backend, the budget and policy sampling.

Sample j of prefix k must be the same draw on every retry, on every worker and after any
restart, so seeds are a pure function of what identifies the sample, never of process
state (Python's ``hash()`` is salted per process; ``random`` state is per worker).
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A stable 31-bit seed from any parts: the same parts give the same seed everywhere."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF

"""Where an attempt goes, and whether that is where the profile approved.

Owns: `Target` (a loaded profile and the exact URL built from it) and the destination
check: the URL must be the profile's approved base_url, and the profile the one currently
loaded (same digest). An unapproved destination is never a matter of mode.
Must not: do I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from gateway.config.runtime import LoadedProfile, Runtime


@dataclass(frozen=True, slots=True)
class Target:
    """Where one attempt goes: a loaded profile and the exact URL built from it."""

    profile_id: str
    profile_digest: str
    url: str
    carrier: str

    @classmethod
    def for_profile(cls, loaded: LoadedProfile, carrier: str, path: str) -> Target:
        base = loaded.profile.base_url.rstrip("/")
        return cls(loaded.profile.id, loaded.digest, base + path, carrier)


def destination_ok(target: Target, loaded: LoadedProfile, runtime: Runtime) -> bool:
    """The target URL must be the profile's approved base_url, and the profile must be the
    one currently loaded (same digest)."""
    current = runtime.profiles.get(target.profile_id)
    if current is None or current.digest != target.profile_digest or current is not loaded:
        return False
    approved = urlsplit(loaded.profile.base_url)
    actual = urlsplit(target.url)
    if (actual.scheme, actual.hostname, actual.port) != (approved.scheme, approved.hostname, approved.port):
        return False
    return actual.path.startswith(approved.path.rstrip("/") + "/") and not actual.query

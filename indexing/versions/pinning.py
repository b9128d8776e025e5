"""An index version pinned by name: `<index>@v000003` (local folder or URI), accepted wherever an index path is.

A run's driver calls `pin_index` (remote.py) once at start and hands the pinned spec to every replica, so all of them
search the same version even when a build publishes a newer one meanwhile (each would otherwise read
`CURRENT` when it opens). A pinned version stays readable: old versions are kept for a day after they are
superseded (manifest.RETIRED_GRACE_S).
"""

from __future__ import annotations

import os
import re

from indexing.errors import IndexingError

_PIN = re.compile(r"^(?P<base>.+)@v(?P<n>\d+)$")


def split_pin(spec: str | os.PathLike) -> tuple[str, str | None]:
    """(index path or URI, version name or None): `s3://b/idx@v3` -> ("s3://b/idx", "v000003"). A local
    folder whose own name ends so is taken as a folder."""
    text = str(spec)
    m = _PIN.match(text)
    if m is None or ("://" not in text and os.path.exists(text)):
        return text, None
    return m["base"], f"v{int(m['n']):06d}"


def resolve_version(spec: str | os.PathLike, version: str | None) -> tuple[str, str | None]:
    """(index path, the version to open): the pin of `spec`, else `version` (they must agree when both given)."""
    base, pinned = split_pin(spec)
    if pinned and version and version != pinned:
        raise IndexingError(f"index {spec} is pinned to {pinned}, but version {version} was asked for")
    return base, pinned or version

"""An index's published versions: the manifest and its checksums (manifest), copies in object storage and their
local cache (remote), and a name pinned to one version, `dir@v000003` (pinning)."""

__all__ = ["manifest", "pinning", "remote"]

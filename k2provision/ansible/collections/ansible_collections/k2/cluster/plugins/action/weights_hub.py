"""Action k2.cluster.weights_hub: the manifest of a pinned hub revision, from metadata alone.

Runs on the controller. LFS files (the safetensors shards) take the hub's own sha256; small
files kept outside LFS (config.json, tokenizer files) have none in the metadata and are listed
under ``plain`` with their sizes, to be hashed on the seed once downloaded. The token comes from
the ``token`` option (an ansible-vault variable) or the controller's HF_TOKEN /
HUGGING_FACE_HUB_TOKEN; it is never returned, and error text is scrubbed of it.
"""

from __future__ import annotations

import fnmatch
import glob
from collections.abc import Sequence
from typing import Any

from ansible.plugins.action import ActionBase

from k2provision.errors import K2Error
from k2provision.weights.manifest import (
    ManifestError,
    hub_model_info,
    hub_token,
    manifest_from_hub_info,
    natural_key,
    redact,
)


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def hub_manifest(
    repo: str, revision: str, patterns: Sequence[str], token: str | None, api: Any = None
) -> dict[str, Any]:
    """{manifest (LFS files), plain: [{name, size}], revision} for ``repo`` at ``revision``."""
    info = hub_model_info(repo, revision, token, api)
    lfs: list[str] = []
    plain: list[dict[str, Any]] = []
    for sib in _field(info, "siblings") or []:
        name = _field(sib, "rfilename")
        if not isinstance(name, str):
            continue
        if patterns and not any(fnmatch.fnmatchcase(name, p) for p in patterns):
            continue
        entry = _field(sib, "lfs")
        if entry and _field(entry, "sha256"):
            lfs.append(name)
        else:
            size = _field(sib, "size")
            plain.append({"name": name, "size": size if isinstance(size, int) else 0})
    if not lfs:
        raise ManifestError(
            [
                f"{repo}@{revision}: no LFS file matches {list(patterns) or ['*']}; fix: check "
                "k2_weights_allow_patterns"
            ]
        )

    exact = [glob.escape(name) for name in lfs]
    manifest = manifest_from_hub_info(info, model=repo, revision=revision, allow_patterns=exact)
    plain.sort(key=lambda e: natural_key(str(e["name"])))
    return {
        "manifest": manifest.model_dump(mode="json"),
        "plain": plain,
        "revision": manifest.revision,
        "total_bytes": manifest.total_bytes + sum(int(e["size"]) for e in plain),
    }


class ActionModule(ActionBase):  # type: ignore[misc]  # Ansible's base class is untyped
    """Return the LFS manifest, the small files to hash after download, the resolved commit."""

    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        args = self._task.args
        token = str(args.get("token") or "") or hub_token()
        try:
            found = hub_manifest(
                str(args["repo"]),
                str(args["revision"]),
                [str(p) for p in args.get("patterns") or []],
                token or None,
            )
        except K2Error as error:
            message = redact("; ".join(error.problems), [token])
            result.update(failed=True, msg=message, error=message)
            return result
        result.update(changed=False, token_given=bool(token), **found)
        return result

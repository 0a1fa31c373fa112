"""Module k2.cluster.weights_hub_download: one pinned revision from the Hugging Face hub."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: weights_hub_download
short_description: Download one pinned revision of a model from the Hugging Face hub
description:
  - Runs C(huggingface_hub.snapshot_download) into O(path) on the host that seeds the
    broadcast, with C(hf_transfer) when it is installed (hf-xet is used by huggingface_hub
    itself when present). The token is never returned or logged; error text is scrubbed of it.
options:
  repo:
    description: The hub repository, e.g. moonshotai/Kimi-K2-Instruct.
    type: str
    required: true
  revision:
    description: The commit to download (pinned).
    type: str
    required: true
  path:
    description: Where the files go.
    type: path
    required: true
  patterns:
    description: Allow patterns; empty means every file.
    type: list
    elements: str
    default: []
  token:
    description: Hugging Face token (from the environment or ansible-vault); empty for none.
    type: str
    default: ""
author: k2provision
"""

RETURN = r"""
path:
  description: The directory the snapshot is in.
  type: str
"""


def scrub(text: str, secret: str) -> str:
    return text.replace(secret, "***") if secret else text


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "repo": {"type": "str", "required": True},
            "revision": {"type": "str", "required": True},
            "path": {"type": "path", "required": True},
            "patterns": {"type": "list", "elements": "str", "default": []},
            "token": {"type": "str", "default": "", "no_log": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    if module.check_mode:
        module.exit_json(changed=True, path=p["path"])
    if importlib.util.find_spec("hf_transfer") is not None:
        os.environ.setdefault("HF_HUB_ENABLE_HF_TRANSFER", "1")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        module.fail_json(
            msg="huggingface_hub is not installed for this host's python; fix: pip install "
            "'huggingface_hub[hf_transfer]' there, or seed from the controller "
            "(k2_weights_source_host=localhost)"
        )
    kwargs: dict[str, Any] = {
        "repo_id": p["repo"],
        "revision": p["revision"],
        "local_dir": p["path"],
        "token": p["token"] or None,
    }
    if p["patterns"]:
        kwargs["allow_patterns"] = p["patterns"]
    try:
        os.makedirs(p["path"], exist_ok=True)
        snapshot_download(**kwargs)
    except Exception as exc:  # the hub client raises many types; all end here, scrubbed
        module.fail_json(
            msg=scrub(
                f"{p['repo']}@{p['revision']}: download failed: {exc.__class__.__name__}: {exc}",
                p["token"],
            )
        )
    module.exit_json(changed=True, path=p["path"])


if __name__ == "__main__":
    main()

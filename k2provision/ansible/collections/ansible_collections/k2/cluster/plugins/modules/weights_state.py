"""Module k2.cluster.weights_state: what a host already holds of a weight manifest (read-only)."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule

from ..module_utils.k2_weights.store import local_state

DOCUMENTATION = r"""
module: weights_state
short_description: What a model directory holds of a weight manifest, and the free disk space
description:
  - Compares the files of O(files) with O(dest) by size and the relay's stored manifest
    (C(.k2-manifest.json), sizes, sha256 and mtimes of the files it verified). Reads only;
    never hashes. Reports what would have to be transferred (a half-received file with a
    resume point counts only its missing bytes) and the free space for it.
options:
  dest:
    description: The model directory.
    type: path
    required: true
  files:
    description: Manifest entries (name, size, sha256).
    type: list
    elements: dict
    required: true
author: k2provision
"""

RETURN = r"""
complete:
  description: Every file is present and verified.
  type: bool
need_bytes:
  description: The most bytes that may have to be written.
  type: int
resumable:
  description: Missing files whose partial copy resumes (name, offset).
  type: list
free_bytes:
  description: Free bytes where the files go.
  type: int
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dest": {"type": "path", "required": True},
            "files": {"type": "list", "elements": "dict", "required": True},
        },
        supports_check_mode=True,
    )
    try:
        state = local_state(module.params["dest"], module.params["files"])
    except (OSError, KeyError, TypeError, ValueError) as exc:
        module.fail_json(msg=f"cannot read {module.params['dest']}: {exc}")
    module.exit_json(changed=False, **state)


if __name__ == "__main__":
    main()

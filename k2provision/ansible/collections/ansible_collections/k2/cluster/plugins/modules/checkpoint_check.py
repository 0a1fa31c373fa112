"""Module k2.cluster.checkpoint_check: whether a model directory holds a loadable checkpoint."""

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule

from ..module_utils.k2_weights.checkpoint import checkpoint_problems

DOCUMENTATION = r"""
module: checkpoint_check
short_description: Whether a model directory holds a loadable checkpoint (read-only)
description:
  - Checks that O(path) has a parseable C(config.json) and, when
    C(model.safetensors.index.json) is there, every shard its weight_map names, each with a
    safetensors header whose data size matches the file size. Reads headers only.
  - With O(need=directory) only the directory itself must exist (a host whose containers
    mount it but load no weights, such as a router host).
  - Never fails by itself; the caller words the failure with the host and the fix.
options:
  path:
    description: The model directory.
    type: path
    required: true
  need:
    description: C(checkpoint) (a loadable checkpoint) or C(directory) (the directory only).
    type: str
    choices: [checkpoint, directory]
    default: checkpoint
author: k2provision
"""

RETURN = r"""
problems:
  description: What is missing or wrong, one line each (empty when the checkpoint is loadable).
  type: list
  elements: str
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "need": {
                "type": "str",
                "choices": ["checkpoint", "directory"],
                "default": "checkpoint",
            },
        },
        supports_check_mode=True,
    )
    path = module.params["path"]
    if module.params["need"] == "directory":
        problems = [] if os.path.isdir(path) else [f"{path} does not exist"]
    else:
        problems = checkpoint_problems(path)
    module.exit_json(changed=False, problems=problems)


if __name__ == "__main__":
    main()

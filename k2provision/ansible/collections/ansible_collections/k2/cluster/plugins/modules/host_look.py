"""Module k2.cluster.host_look: what a host holds of its phases, in one call (read-only)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

from ansible.module_utils.basic import AnsibleModule

from ..module_utils import host_questions as hq
from ..module_utils.k2_weights.checkpoint import checkpoint_problems
from ..module_utils.k2_weights.store import local_state

DOCUMENTATION = r"""
module: host_look
short_description: What a host holds of its launch, in one call (read-only)
description:
  - The first step of an apply (action k2.cluster.look calls it): the state the launch phase
    compares with the plan, read in one module call so a converged host costs one round trip.
  - Reports raw facts only; the controller judges them (k2provision/plan/converge.py).
options:
  questions:
    description: The registry's questions (module_utils host_questions), by key, as
      question_json writes them (the rendered files' and the mesh files' digests, the
      processes' states, the health gates' answers); each key answers its record as JSON,
      asked in one shell script.
    type: dict
    default: {}
  model_dir:
    description: The model directory.
    type: str
    default: ""
  need:
    description: What the model directory must hold (checkpoint, directory or none).
    type: str
    choices: [checkpoint, directory, none]
    default: none
  stamp_dir:
    description: Where the phases' stamps are (<phase>.json); each answers its content, or null.
      The prepare stamp's packages answer their dpkg status and version, its images their ID,
      its modules whether they are loaded; the weights stamp's manifest answers what
      O(model_dir) holds of it.
    type: str
    default: ""
  stamps:
    description: The stamped phases.
    type: list
    elements: str
    default: []
  mesh_dir:
    description: The ssh mesh's directory; its public files' texts and the public half of its
      private key are answered (its files' digests are questions).
    type: str
    default: ""
author: k2provision
"""


def _stamp(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _packages(names: list[str]) -> dict[str, dict[str, str]]:
    """One dpkg-query for all names: status abbreviation and version (unknown ones left out)."""
    if not names or shutil.which("dpkg-query") is None:
        return {}
    out = subprocess.run(
        ["dpkg-query", "--show", "--showformat=${Package} ${db:Status-Abbrev} ${Version}\\n",
         *names],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    found = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:
            found[parts[0]] = {"status": parts[1], "version": parts[2]}
    return found


def _images(refs: list[str]) -> dict[str, str]:
    """The ID of each image this host holds (missing ones left out)."""
    if not refs or shutil.which("docker") is None:
        return {}
    found = {}
    for ref in refs:
        out = subprocess.run(
            ["docker", "image", "inspect", "--format", "{{.Id}}", ref],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if out.returncode == 0 and out.stdout.strip():
            found[ref] = out.stdout.strip()
    return found


def _weights(manifest: str, model_dir: str) -> dict[str, Any] | None:
    """What the model directory holds of the distributed manifest (sizes and stamps only)."""
    found = _stamp(manifest) if manifest else None
    if found is None:
        return None
    state = local_state(model_dir, list(found.get("files") or []))
    return {
        "missing": state.get("missing", []),
        "wrong": [w["name"] for w in state.get("wrong", [])],
        "unverified": state.get("unverified", []),
    }


def _text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return ""


def _mesh(mesh_dir: str) -> dict[str, Any]:
    if not mesh_dir:
        return {}
    private = os.path.join(mesh_dir, "id_ed25519")
    public = ""
    if os.path.isfile(private) and shutil.which("ssh-keygen"):
        out = subprocess.run(
            ["ssh-keygen", "-y", "-f", private], capture_output=True, text=True, check=False
        )
        public = out.stdout.strip() if out.returncode == 0 else ""
    return {
        "private_public": public,
        "public": _text(os.path.join(mesh_dir, "id_ed25519.pub")),
        "authorized_keys": _text(os.path.join(mesh_dir, "authorized_keys")),
        "known_hosts": _text(os.path.join(mesh_dir, "known_hosts")),
        "host_public": _text(os.path.join(mesh_dir, "ssh_host_ed25519_key.pub")),
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "questions": {"type": "dict", "default": {}},
            "model_dir": {"type": "str", "default": ""},
            "need": {
                "type": "str",
                "choices": ["checkpoint", "directory", "none"],
                "default": "none",
            },
            "stamp_dir": {"type": "str", "default": ""},
            "stamps": {"type": "list", "elements": "str", "default": []},
            "mesh_dir": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    params = module.params
    docker = shutil.which("docker") is not None
    model_dir = params["model_dir"]
    if params["need"] == "checkpoint":
        problems = checkpoint_problems(model_dir)
    elif params["need"] == "directory":
        problems = [] if os.path.isdir(model_dir) else [f"{model_dir} does not exist"]
    else:
        problems = []
    stamps = {
        phase: _stamp(os.path.join(params["stamp_dir"], f"{phase}.json"))
        for phase in params["stamps"]
    }
    prepare = stamps.get("prepare") or {}
    weights = stamps.get("weights") or {}
    module.exit_json(
        changed=False,
        stamps=stamps,
        packages=_packages([str(p) for p in prepare.get("packages") or []]),
        images=_images([str(i) for i in prepare.get("images") or {}]),
        modules={
            str(m): os.path.isdir(f"/sys/module/{str(m).replace('-', '_')}")
            for m in prepare.get("modules") or []
        },
        weights=_weights(str(weights.get("manifest") or ""), model_dir),
        mesh=_mesh(params["mesh_dir"]),
        docker=docker,
        answers=hq.ask_json(params["questions"], sys.executable),
        checkpoint=problems,
    )


if __name__ == "__main__":
    main()

"""Module k2.cluster.host_look: what a host holds of its phases, in one call (read-only)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import urllib.error
import urllib.request
from typing import Any

from ansible.module_utils.basic import AnsibleModule

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
  files:
    description: Paths of the rendered files; each answers its sha256 and mode, or null.
    type: list
    elements: str
    default: []
  containers:
    description: Container names; each present one answers whether it runs and its spec hash.
    type: list
    elements: str
    default: []
  execs:
    description: Exec'd processes (name, container, pid_file); each answers whether it lives.
    type: list
    elements: dict
    default: []
  gates:
    description: Health gates (name, url or command, container); each answers the HTTP status
      of a GET of its url, or the exit status of its command in the container.
    type: list
    elements: dict
    default: []
  label:
    description: The container label that carries the spec hash.
    type: str
    required: true
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
    description: The ssh mesh's directory; its public files' texts, the public half of its
      private key, and each of O(mesh_files)' sha256 and mode are answered.
    type: str
    default: ""
  mesh_files:
    description: The mesh's files (names in O(mesh_dir)).
    type: list
    elements: str
    default: []
author: k2provision
"""


GATE_TIMEOUT_S = 5


def _file(path: str) -> dict[str, str] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {"sha256": digest.hexdigest(), "mode": f"{stat.S_IMODE(info.st_mode):04o}"}


def _containers(names: list[str], label: str) -> dict[str, dict[str, Any]]:
    """One `docker container inspect` for all names (missing ones are left out)."""
    if not names:
        return {}
    out = subprocess.run(
        ["docker", "container", "inspect", *names], capture_output=True, text=True, check=False
    )
    try:
        infos = json.loads(out.stdout or "[]")
    except ValueError:
        infos = []
    found = {}
    for info in infos:
        name = str(info.get("Name", "")).lstrip("/")
        labels = (info.get("Config") or {}).get("Labels") or {}
        found[name] = {
            "running": bool((info.get("State") or {}).get("Running")),
            "hash": labels.get(label),
        }
    return found


def _exec_alive(container: str, pid_file: str) -> bool:
    out = subprocess.run(
        ["docker", "exec", container, "sh", "-c", f'kill -0 "$(cat {pid_file})"'],
        capture_output=True, check=False,
    )  # fmt: skip
    return out.returncode == 0


def _gate(gate: dict[str, Any]) -> str:
    """What a health gate answers now: an HTTP status, a command's exit status, or why none."""
    if gate.get("url"):
        try:
            with urllib.request.urlopen(str(gate["url"]), timeout=GATE_TIMEOUT_S) as reply:
                return str(reply.status)
        except urllib.error.HTTPError as error:
            return str(error.code)
        except (OSError, ValueError) as error:
            return f"no answer ({getattr(error, 'reason', error)})"
    argv = ["docker", "exec", str(gate["container"]), *[str(a) for a in gate["command"]]]
    return str(subprocess.run(argv, capture_output=True, check=False).returncode)


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


def _mesh(mesh_dir: str, names: list[str]) -> dict[str, Any]:
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
        "files": {name: _file(os.path.join(mesh_dir, name)) for name in names},
        "private_public": public,
        "public": _text(os.path.join(mesh_dir, "id_ed25519.pub")),
        "authorized_keys": _text(os.path.join(mesh_dir, "authorized_keys")),
        "known_hosts": _text(os.path.join(mesh_dir, "known_hosts")),
        "host_public": _text(os.path.join(mesh_dir, "ssh_host_ed25519_key.pub")),
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "list", "elements": "str", "default": []},
            "containers": {"type": "list", "elements": "str", "default": []},
            "execs": {"type": "list", "elements": "dict", "default": []},
            "gates": {"type": "list", "elements": "dict", "default": []},
            "label": {"type": "str", "required": True},
            "model_dir": {"type": "str", "default": ""},
            "need": {
                "type": "str",
                "choices": ["checkpoint", "directory", "none"],
                "default": "none",
            },
            "stamp_dir": {"type": "str", "default": ""},
            "stamps": {"type": "list", "elements": "str", "default": []},
            "mesh_dir": {"type": "str", "default": ""},
            "mesh_files": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    docker = shutil.which("docker") is not None
    running = _containers(params["containers"], params["label"]) if docker else {}
    execs = {
        str(e["name"]): docker
        and bool(running.get(str(e["container"]), {}).get("running"))
        and _exec_alive(str(e["container"]), str(e["pid_file"]))
        for e in params["execs"]
    }
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
        mesh=_mesh(params["mesh_dir"], params["mesh_files"]),
        files={path: _file(path) for path in params["files"]},
        docker=docker,
        containers=running,
        execs=execs,
        gates={str(g["name"]): _gate(g) for g in params["gates"]},
        checkpoint=problems,
    )


if __name__ == "__main__":
    main()

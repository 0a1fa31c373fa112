"""Action k2.cluster.look: what differs on this host from the plan, per phase (read-only).

The first step of an apply. It asks the host in one module call (k2.cluster.host_look) about
everything the looked-at phases place there and compares the answer with the plan
(k2provision/plan/converge.py), with the cluster's mesh public key on the controller (where
the mesh's stamp says it is). With ``full`` every phase runs every task; the host is still
asked, for whether it serves.

Options: plan (required): the plan registered by k2.cluster.plan; full (bool): run everything.
Returns (registered as k2_converge): full (bool); phases: {phase: [difference, ...]} (an empty
list: the phase is converged on this host and skips its tasks there), in words for people;
found: {phase: [{subject, name, drift, detail}, ...]}, the same as typed records (what the
rollout decides on, never the words); differences: the lines, named by phase; files,
containers: the launch's repairs here (files to write, containers to
recreate; look.yml then adds the ranks of an instance another host of which recreates its
own, converge.instance_repairs); docker (whether it answered), checkpoint (what the model
directory lacks);
smoke_host: the host the smoke test runs from; launch_selected: whether the tags run the launch
phase; skipped_phases: the phases whose play ends this host at its start (each phase's play
begins with meta end_host for a host whose skipped_phases name it; look.yml then keeps the
cluster phases and checks only where every host skips them); stamps: {phase: digest} and
stamp_dir: what prepare, ssh_mesh and weights record at their end (with full too); serving
(with full too): whether a planned container runs here now, on any spec (converge.serving:
no GPU-taking check, driver change or reboot may touch the host); host_work (the driver's
inputs' digest, which the prepare stamp records) and host_work_changed (the stamp records
others). Under --check it reports changed when anything differs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase

from k2provision.core.inventory import plain_value
from k2provision.core.records import Plan
from k2provision.plan.converge import (
    PHASE_TAGS,
    STAMP_DIR,
    difference_lines,
    differences,
    expected_state,
    host_work_changed,
    look_request,
    repairs,
    selected,
    serving,
    skipped_phases,
    smoke_host,
)


def _text(path: str) -> str:
    """A file on the controller, or empty where it is missing."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


class ActionModule(ActionBase):  # type: ignore[misc]  # Ansible's base class is untyped
    """Look at the host once; the differences per phase."""

    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = plain_value(dict(self._task.args))
        result["changed"] = False
        host = str(task_vars["inventory_hostname"])
        try:
            expected = expected_state(Plan.model_validate(args["plan"]), host, task_vars)
        except (KeyError, ValueError) as error:
            return {**result, "failed": True, "msg": f"{host}: {error}"}
        result.update(stamps=dict(expected.stamps), stamp_dir=STAMP_DIR)
        seen = self._execute_module(
            module_name="k2.cluster.host_look",
            module_args=look_request(expected),
            task_vars=task_vars,
        )
        if seen.get("failed") or seen.get("unreachable"):
            return {**result, **seen}
        result.update(
            host_work=expected.host_work, host_work_changed=host_work_changed(expected, seen)
        )
        if str(args.get("full", False)).lower() in {"true", "yes", "1"}:
            # Every task runs, but whether the host serves still guards the host work.
            full = {"full": True, "phases": {}, "found": {}, "differences": []}
            return {**result, **full, "serving": serving(expected, seen)}
        mesh_stamp = (seen.get("stamps") or {}).get("ssh_mesh") or {}
        if mesh_stamp.get("key_dir") and isinstance(seen.get("mesh"), dict):
            seen["mesh"]["controller_public"] = _text(f"{mesh_stamp['key_dir']}/id_ed25519.pub")
        found = differences(expected, seen)
        phases = difference_lines(found)
        lines = [f"{phase}: {line}" for phase, texts in phases.items() for line in texts]
        result.update(
            full=False,
            phases=phases,
            found={phase: [d.as_json() for d in diffs] for phase, diffs in found.items()},
            differences=lines,
            **repairs(found["launch"]),
        )
        result.update(docker=bool(seen.get("docker")), checkpoint=seen.get("checkpoint") or [])
        run_tags = [str(t) for t in task_vars.get("ansible_run_tags") or ()]
        skip_tags = [str(t) for t in task_vars.get("ansible_skip_tags") or ()]
        smoke = smoke_host(
            str(args["plan"].get("endpoint_host")),
            [str(h) for h in task_vars.get("ansible_play_hosts_all") or [host]],
        )
        serves = serving(expected, seen)
        skipped = skipped_phases(
            phases, run_tags=run_tags, skip_tags=skip_tags, endpoint=host == smoke, serving=serves
        )
        result["serving"] = serves
        result["smoke_host"] = smoke
        result["launch_selected"] = selected(PHASE_TAGS["launch"], run_tags, skip_tags)
        result["skipped_phases"] = skipped
        result["changed"] = bool(lines) and bool(self._play_context.check_mode)
        return result

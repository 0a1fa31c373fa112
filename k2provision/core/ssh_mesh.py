"""The mpirun mesh's sshd and ssh configurations, from one pair of templates. Pure.

mpirun reaches every node through an sshd inside its container (port 2233 unless the inventory
says otherwise), with the keys and known_hosts the ssh_mesh role places in `ssh_dir`. The
TensorRT-LLM engine renders these files into its plan; the ssh_mesh role renders the same
templates (through the k2.cluster.mesh_ssh_configs filter) where a plan renders none.
"""

from __future__ import annotations

from collections.abc import Sequence

from k2provision.core.templating import render_template

SSHD_CONFIG = "sshd_config"
SSH_CONFIG = "ssh_config"


def mesh_ssh_configs(
    ssh_dir: str,
    port: int,
    container: str = "",
    user_environment: Sequence[str] = (),
    allow_from: Sequence[str] = (),
) -> dict[str, str]:
    """{path: text} of the mesh's sshd_config and ssh_config in `ssh_dir`: sshd listens on
    `port` inside `container`; `user_environment` names the variables ssh sessions take from
    /root/.ssh/environment (none: sshd's default); `allow_from`, where given, the only
    addresses root may log in from (a fleet instance's own hosts: its own MPI world)."""
    values = {
        "container": container, "port": port, "ssh_dir": ssh_dir,
        "user_environment": tuple(user_environment), "allow_from": tuple(allow_from),
    }  # fmt: skip
    return {
        f"{ssh_dir}/{name}": render_template(f"ssh_mesh/{name}.j2", **values)
        for name in (SSHD_CONFIG, SSH_CONFIG)
    }

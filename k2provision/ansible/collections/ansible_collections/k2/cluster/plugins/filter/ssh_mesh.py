"""Filter k2.cluster.mesh_ssh_configs: the mpirun mesh's sshd_config and ssh_config as
k2provision renders them (core/ssh_mesh.py), for engines whose plan renders none."""

from __future__ import annotations

from typing import Any

from k2provision.core.ssh_mesh import mesh_ssh_configs as render_mesh_ssh_configs


def mesh_ssh_configs(ssh_dir: str, port: Any) -> dict[str, str]:
    """{path: text} of the mesh's two configurations in `ssh_dir`, sshd on `port`."""
    return render_mesh_ssh_configs(str(ssh_dir), int(port))


class FilterModule:
    """Ansible's entry point for filter plugins."""

    def filters(self) -> dict[str, Any]:
        return {"mesh_ssh_configs": mesh_ssh_configs}

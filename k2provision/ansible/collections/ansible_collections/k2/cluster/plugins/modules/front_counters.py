"""Module k2.cluster.front_counters: what this host's HAProxy counted for each router."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule

from ..module_utils.host_questions import haproxy_ask, haproxy_servers

DOCUMENTATION = r"""
module: front_counters
short_description: Read each server's counters in an HAProxy backend through the runtime API
description:
  - Asks HAProxy's runtime API (its admin UNIX socket) on the host it runs on for C(show stat)
    and returns, for each server of the backend, its status, the requests HAProxy sent it
    since it started (C(stot); health checks are not counted) and how many were answered with
    a 5xx status (C(hrsp_5xx)). Changes nothing; runs in check mode.
options:
  socket:
    description: HAProxy's admin socket.
    type: path
    required: true
  backend:
    description: The backend.
    type: str
    required: true
author: k2provision
"""

RETURN = r"""
servers:
  description: Server name -> {status, requests, errors, sessions}.
  type: dict
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "socket": {"type": "path", "required": True},
            "backend": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    path, backend = module.params["socket"], module.params["backend"]
    try:
        servers = haproxy_servers(haproxy_ask(path, "show stat"), backend)
    except OSError as error:
        module.fail_json(
            msg=f"HAProxy ({path}): {error}; fix: check that HAProxy runs there with the "
            "front's configuration (its `stats socket` line)"
        )
        return
    if not servers:
        module.fail_json(
            msg=f"HAProxy ({path}) lists no server in backend {backend}; fix: apply the front "
            "again (tag front) so that HAProxy's configuration lists every router of the plan"
        )
        return
    module.exit_json(
        changed=False,
        servers={
            s.name: {
                "status": s.status,
                "requests": s.requests,
                "errors": s.errors,
                "sessions": s.sessions,
            }
            for s in servers.values()
        },
    )


if __name__ == "__main__":
    main()

"""Module k2.cluster.front_server: take one router out of this host's HAProxy, or put it back."""

from __future__ import annotations

import time

from ansible.module_utils.basic import AnsibleModule

from ..module_utils.host_questions import BackendServer, haproxy_ask, haproxy_servers

DOCUMENTATION = r"""
module: front_server
short_description: Drain one server of an HAProxy backend, or make it ready, through the runtime API
description:
  - Talks to HAProxy's runtime API (its admin UNIX socket) on the host it runs on, without a
    reload. C(state=drain) stops new requests going to the server (those in flight go on),
    then waits until none is in flight through it. C(state=ready) takes it back and waits
    until HAProxy's health check counts it C(UP).
  - A server already in the asked state is not changed (only waited for). In check mode it
    changes nothing and waits for nothing.
options:
  socket:
    description: HAProxy's admin socket.
    type: path
    required: true
  backend:
    description: The backend.
    type: str
    required: true
  server:
    description: The server's name in the backend.
    type: str
    required: true
  state:
    description: Where the server goes (none - it stays as it is).
    type: str
    choices: [drain, ready]
  weight:
    description:
      - The server's weight, set first (C(set weight) - a number, or a percentage of the
        weight its configuration gives it, C(100%) bringing that back). None - left alone.
    type: str
  timeout:
    description: Seconds to wait (drain - until no request is in flight; ready - until UP).
    type: int
    default: 120
author: k2provision
"""

RETURN = r"""
status:
  description: The server's status in HAProxy's C(show stat) at the end (UP, DRAIN, DOWN, ...).
  type: str
sessions:
  description: Requests in flight through the server at the end.
  type: int
drained:
  description: Whether the server is set to drain at the end (HAProxy sends it no new request).
  type: bool
"""

# srv_admin_state bits (HAProxy's `show servers state`): forced and inherited drain; the
# maintenance ones.
_DRAIN_BITS = 0x08 | 0x10
_MAINT_BITS = 0x01 | 0x02 | 0x20 | 0x40


def _stat(path: str, backend: str, server: str) -> BackendServer | None:
    """The server as `show stat` reports it (None: no such server)."""
    return haproxy_servers(haproxy_ask(path, "show stat"), backend).get(server)


def _admin_state(path: str, backend: str, server: str) -> int:
    """The server's srv_admin_state bits (`show servers state BACKEND`)."""
    lines = haproxy_ask(path, f"show servers state {backend}").splitlines()
    header = next((x[2:].split() for x in lines if x.startswith("# ")), [])
    for line in lines:
        fields = line.split()
        row = dict(zip(header, fields))
        if row.get("srv_name") == server and "srv_admin_state" in row:
            return int(row["srv_admin_state"])
    return 0


def _settle(path: str, backend: str, server: str, state: str, timeout: int) -> BackendServer:
    """Poll the server until `state` is reached (drain: nothing in flight; ready: UP) or
    `timeout` seconds pass; its last row."""
    deadline = time.monotonic() + timeout
    while True:
        row = _stat(path, backend, server)
        if row is None:
            raise LookupError(server)
        done = row.sessions == 0 if state == "drain" else row.status == "UP"
        if done or time.monotonic() >= deadline:
            return row
        time.sleep(0.25)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "socket": {"type": "path", "required": True},
            "backend": {"type": "str", "required": True},
            "server": {"type": "str", "required": True},
            "state": {"type": "str", "choices": ["drain", "ready"]},
            "weight": {"type": "str"},
            "timeout": {"type": "int", "default": 120},
        },
        required_one_of=[("state", "weight")],
        supports_check_mode=True,
    )
    path, backend, server = (module.params[k] for k in ("socket", "backend", "server"))
    state, timeout = module.params["state"], module.params["timeout"]
    weight = module.params["weight"]
    where = f"{backend}/{server} in HAProxy ({path})"
    try:
        row = _stat(path, backend, server)
        if row is None:
            raise LookupError(server)
        admin = _admin_state(path, backend, server)
        drained = bool(admin & _DRAIN_BITS)
        ready = not admin & (_DRAIN_BITS | _MAINT_BITS)
        changed = (state == "drain" and not drained) or (state == "ready" and not ready)
        changed = changed or weight is not None
        if module.check_mode:
            module.exit_json(
                changed=changed, status=row.status, sessions=row.sessions, drained=drained
            )
            return
        if weight is not None:
            answer = haproxy_ask(path, f"set weight {backend}/{server} {weight}").strip()
            if answer:
                module.fail_json(msg=f"{where}: `set weight ... {weight}` answered {answer!r}")
        if state is None:
            module.exit_json(
                changed=True, status=row.status, sessions=row.sessions, drained=drained
            )
            return
        if changed:
            answer = haproxy_ask(path, f"set server {backend}/{server} state {state}").strip()
            if answer:
                module.fail_json(msg=f"{where}: `set server ... state {state}` answered {answer!r}")
        row = _settle(path, backend, server, state, timeout)
    except LookupError:
        module.fail_json(
            msg=f"{where}: no such server; fix: apply the front again (tag front) so that "
            "HAProxy's configuration lists every router of the plan"
        )
        return
    except OSError as error:
        module.fail_json(
            msg=f"{where}: {error}; fix: check that HAProxy runs there with the front's "
            "configuration (its `stats socket` line)"
        )
        return
    result = {"status": row.status, "sessions": row.sessions, "drained": state == "drain"}
    if row.sessions if state == "drain" else row.status != "UP":
        expected = "no request in flight" if state == "drain" else "status UP"
        fix = (
            "let the streams finish (a longer k2_drain_timeout) or find what holds them"
            if state == "drain"
            else "read the router's log (k2provision logs) and its /health"
        )
        module.fail_json(
            msg=f"{where}: {row.sessions} requests in flight, status {row.status} after "
            f"{timeout} s, expected {expected}; fix: {fix}",
            changed=changed,
            **result,
        )
    module.exit_json(changed=changed, **result)


if __name__ == "__main__":
    main()

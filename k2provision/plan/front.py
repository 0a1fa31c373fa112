"""The front tier: several routers behind one floating address. Pure.

Two or more [router] hosts each run a router (on its k2_local_ip and k2_router_port), HAProxy
(on the endpoint's port, every address) and keepalived, which holds the floating address
(k2_front_address) on one of them at a time. Every HAProxy sends to every router that answers
its health check, so the routers run active-active and adding one adds capacity; the address
moves when its holder dies or its HAProxy stops. Role k2_front_tier installs both from the
distribution's packages and writes the files :func:`front_files` renders here.

Choices, each with its reason:

- keepalived in VRRP version 3 with half-second adverts: a backup takes the address after
  three missed adverts plus its skew (about 1.6 s), where version 2's whole seconds take 3.4;
  unicast to the other front hosts, so no switch has to pass VRRP's multicast.
- Every host starts as BACKUP with ``nopreempt``: the address stays where it is when a host
  with a higher priority comes back (moving it back would cut every connection a second time).
- ``track_script`` without a weight: when HAProxy is not running, the instance goes to FAULT and
  gives the address up at once (with nopreempt a lowered priority would not move it).
- HAProxy in HTTP mode, sending requests to the routers in turn by weight (``roundrobin``:
  the routers are equal proxies that balance the instances themselves, and a weight is then an
  exact share, which a change's canary and a PD change's generations set at runtime;
  ``leastconn`` would send every request to the heaviest idle router), checking each router's
  liveness twice a second (every quarter second after a failure, each check given 1 s to
  answer), out after two failed checks or at once when a request cannot connect to it
  (``observe layer4``, ``on-error mark-down``: a router whose host lost its link would
  otherwise take requests until its second failed check); connections are given 500 ms
  (routers sit on the same network, and a router whose host died must be found out by about
  when a backup takes the address, 1.6 s); a request whose connection fails, or that gets an
  empty answer, is sent to another router (``retry-on``, ``redispatch``); a request may run
  as long as the routers let it (their ``--request-timeout-secs``). Its runtime API (a UNIX
  socket, root only) is there to take a router out before that router stops, since a draining
  sglang-router still answers ``/health`` 200 (docs/engines.md): a router that changes is
  set to ``drain`` there on every front host, and ``ready`` once its successor serves
  (plan/rollout.py, router waves).
"""

from __future__ import annotations

import ipaddress

from k2provision.core.records import Cluster, FrontHost, FrontPlan, Plan, RouterRef
from k2provision.engines.common import http_url

__all__ = [
    "HAPROXY_CONFIG",
    "HAPROXY_SOCKET",
    "KEEPALIVED_CONFIG",
    "front_files",
    "front_plan",
    "haproxy_config",
    "keepalived_config",
    "router_refs",
]

HAPROXY_CONFIG = "/etc/haproxy/haproxy.cfg"
KEEPALIVED_CONFIG = "/etc/keepalived/keepalived.conf"
HAPROXY_SOCKET = "/var/lib/haproxy/k2-admin.sock"
"""HAProxy's runtime API (the Debian package creates /var/lib/haproxy)."""
BACKEND = "k2_routers"
TOP_PRIORITY = 150
PRIORITY_STEP = 10
ADVERT_S = 0.5
HAPROXY_MAXCONN = 50000
"""Connections one HAProxy holds at once (it raises its open-file limit to twice that)."""
LAB_HAPROXY_MAXCONN = 4096
"""On lab hosts, which grant 20,000 open files."""


def router_refs(
    cluster: Cluster, endpoint: str, endpoint_host: str, routed: bool
) -> tuple[RouterRef, ...]:
    """Every router of a routed plan: behind the front, each on its k2_local_ip and
    k2_router_port; alone, the endpoint on its host; () without a router."""
    if not routed:
        return ()
    if not cluster.front:
        return (RouterRef(host=endpoint_host, url=endpoint),)
    port = cluster.tunables.router_port
    return tuple(
        RouterRef(
            host=name,
            url=http_url(cluster.host(name).local_ip, port),
            server=name.replace(".", "_"),
        )
        for name in cluster.router_hosts
    )


def front_plan(
    cluster: Cluster,
    routers: tuple[RouterRef, ...],
    router_health_path: str,
    request_timeout_s: int,
) -> FrontPlan | None:
    """The front of a cluster with several routers (None otherwise): the floating address,
    each [router] host with its VRRP priority (inventory order, highest first), the routers."""
    t = cluster.tunables
    if not cluster.front or not t.front_address:
        return None
    address = ipaddress.ip_interface(t.front_address)
    hosts = tuple(
        FrontHost(
            name=name,
            address=cluster.host(name).address,
            priority=TOP_PRIORITY - PRIORITY_STEP * n,
        )
        for n, name in enumerate(cluster.router_hosts)
    )
    return FrontPlan(
        address=str(address.ip),
        prefix=address.network.prefixlen,
        vrid=t.front_vrid,
        interface=t.front_interface,
        port=t.api_port,
        hosts=hosts,
        routers=routers,
        router_health_path=router_health_path,
        request_timeout_s=request_timeout_s,
        maxconn=LAB_HAPROXY_MAXCONN if cluster.lab else HAPROXY_MAXCONN,
        backend=BACKEND,
        admin_socket=HAPROXY_SOCKET,
    )


def _front_host(front: FrontPlan, host: str) -> FrontHost:
    for entry in front.hosts:
        if entry.name == host:
            return entry
    raise ValueError(f"{host} is no front host of the plan; fix: list it in [router]")


def keepalived_config(front: FrontPlan, host: str, interface: str) -> str:
    """keepalived's configuration on `host`: the floating address on `interface`, adverts to
    the other front hosts, HAProxy tracked."""
    me = _front_host(front, host)
    peers = "".join(f"        {h.address}\n" for h in front.hosts if h.name != host)
    return (
        f"# k2provision: the endpoint's floating address on {host} (role k2_front_tier).\n"
        "global_defs {\n"
        f"    router_id {host}\n"
        "    vrrp_version 3\n"
        "    enable_script_security\n"
        "    script_user root\n"
        "}\n"
        "\n"
        "vrrp_script k2_front_haproxy {\n"
        '    script "/usr/bin/pgrep -x haproxy"\n'
        "    interval 1\n"
        "    fall 2\n"
        "    rise 2\n"
        "}\n"
        "\n"
        "vrrp_instance k2_front {\n"
        "    state BACKUP\n"
        "    nopreempt\n"
        f"    interface {interface}\n"
        f"    virtual_router_id {front.vrid}\n"
        f"    priority {me.priority}\n"
        f"    advert_int {ADVERT_S}\n"
        f"    unicast_src_ip {me.address}\n"
        "    unicast_peer {\n"
        f"{peers}"
        "    }\n"
        "    virtual_ipaddress {\n"
        f"        {front.address}/{front.prefix} dev {interface}\n"
        "    }\n"
        "    track_script {\n"
        "        k2_front_haproxy\n"
        "    }\n"
        "    garp_master_delay 1\n"
        "    garp_master_repeat 3\n"
        "}\n"
    )


def haproxy_config(front: FrontPlan, host: str) -> str:
    """HAProxy's configuration on `host`: the endpoint's port on every address, requests to
    the routers that answer their health check in turn by weight."""
    _front_host(front, host)
    timeout = front.request_timeout_s
    servers = "".join(
        f"    server {r.server} {r.url.removeprefix('http://')} check\n" for r in front.routers
    )
    return (
        f"# k2provision: the endpoint's front on {host} (role k2_front_tier).\n"
        "global\n"
        f"    maxconn {front.maxconn}\n"
        f"    stats socket {front.admin_socket} mode 600 level admin\n"
        "\n"
        "defaults\n"
        "    mode http\n"
        "    timeout connect 500ms\n"
        "    timeout check 1s\n"
        f"    timeout client {timeout}s\n"
        f"    timeout server {timeout}s\n"
        "    timeout http-request 30s\n"
        "    timeout http-keep-alive 10s\n"
        "    timeout queue 60s\n"
        "    retries 2\n"
        "    option redispatch 1\n"
        "    retry-on conn-failure empty-response\n"
        "\n"
        "frontend k2_endpoint\n"
        f"    bind :{front.port}\n"
        f"    default_backend {front.backend}\n"
        "\n"
        f"backend {front.backend}\n"
        "    balance roundrobin\n"
        "    option httpchk\n"
        f"    http-check send meth GET uri {front.router_health_path}\n"
        "    http-check expect status 200\n"
        "    default-server inter 500ms fastinter 250ms fall 2 rise 2 observe layer4 error-limit 1"
        " on-error mark-down\n"
        f"{servers}"
    )


def front_files(plan: Plan, host: str, interface: str) -> dict[str, str]:
    """The files role k2_front_tier writes on `host`: HAProxy's and keepalived's configurations."""
    if plan.front is None:
        raise ValueError("the plan has no front; fix: list two or more hosts in [router]")
    return {
        HAPROXY_CONFIG: haproxy_config(plan.front, host),
        KEEPALIVED_CONFIG: keepalived_config(plan.front, host, interface),
    }

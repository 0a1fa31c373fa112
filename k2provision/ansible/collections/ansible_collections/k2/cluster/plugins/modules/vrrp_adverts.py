"""Module k2.cluster.vrrp_adverts: the VRRP adverts this host hears on its network for a while."""

from __future__ import annotations

import select
import socket
import time

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: vrrp_adverts
short_description: Listen for VRRP adverts on the network of one of this host's addresses
description:
  - Joins VRRP's multicast group (224.0.0.18) on the interface that holds C(address), reads
    every VRRP packet (IP protocol 112) this host receives for C(seconds) seconds, multicast or
    unicast to it, and returns one entry per source and virtual router id. A front's preflight
    compares them with its own id and peers (a foreign router with the same id would fight its
    keepalived for the address).
  - Needs root (a raw socket). Changes nothing; runs in check mode too.
options:
  address:
    description: This host's IPv4 address on the network to listen on.
    type: str
    required: true
  seconds:
    description: How long to listen (VRRP routers advertise every second by default).
    type: float
    default: 3
author: k2provision
"""

RETURN = r"""
adverts:
  description: "[{source, vrid, priority, version}], one per source and id heard, in order."
  type: list
  elements: dict
"""

VRRP_GROUP = "224.0.0.18"
VRRP_PROTOCOL = 112
ADVERTISEMENT = 1


def parse_advert(packet: bytes) -> dict[str, int] | None:
    """A VRRP advertisement's version, virtual router id and priority from a raw IP packet
    (IPv4 header included); None for anything else."""
    if len(packet) < 20 or packet[0] >> 4 != 4:
        return None
    body = packet[(packet[0] & 0x0F) * 4 :]
    if len(body) < 4 or body[0] & 0x0F != ADVERTISEMENT or body[0] >> 4 not in (2, 3):
        return None
    return {"version": body[0] >> 4, "vrid": body[1], "priority": body[2]}


def listen(address: str, seconds: float) -> list[dict[str, object]]:
    """Every (source, vrid) heard on `address`'s network within `seconds`, in order."""
    heard: dict[tuple[str, int], dict[str, object]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, VRRP_PROTOCOL) as sock:
        sock.setsockopt(
            socket.IPPROTO_IP,
            socket.IP_ADD_MEMBERSHIP,
            socket.inet_aton(VRRP_GROUP) + socket.inet_aton(address),
        )
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([sock], [], [], left)
            if not ready:
                continue
            packet, (source, _) = sock.recvfrom(4096)
            advert = parse_advert(packet)
            if advert is not None:
                heard.setdefault((source, advert["vrid"]), {"source": source, **advert})
    return list(heard.values())


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "address": {"type": "str", "required": True},
            "seconds": {"type": "float", "default": 3},
        },
        supports_check_mode=True,
    )
    address = module.params["address"]
    try:
        adverts = listen(address, module.params["seconds"])
    except OSError as error:
        module.fail_json(
            msg=f"cannot listen for VRRP adverts on {address}'s network: {error}; expected a "
            "raw socket joined to 224.0.0.18 there; fix: run the front as root (become), on an "
            "interface that takes multicast (ip link set DEV multicast on)"
        )
        return
    module.exit_json(changed=False, adverts=adverts)


if __name__ == "__main__":
    main()

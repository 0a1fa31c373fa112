"""Lookup k2.cluster.weights_relay: the path of the relay script on the controller."""

from __future__ import annotations

from typing import Any

from ansible.plugins.lookup import LookupBase

from k2provision.weights import relay

DOCUMENTATION = r"""
name: weights_relay
short_description: Path of the weight relay script (k2provision/weights/relay.py)
description:
  - The stdlib-only relay that moves weights host to host; the k2_weights role copies it to
    every host.
author: k2provision
"""


class LookupModule(LookupBase):  # type: ignore[misc]  # Ansible's base class is untyped
    def run(self, terms: list[Any], variables: Any = None, **kwargs: Any) -> list[str]:
        return [str(relay.__file__)]

"""Lookup k2.cluster.weights_relay: the path of the relay zipapp on the controller."""

from __future__ import annotations

from typing import Any

from ansible.plugins.lookup import LookupBase

from k2provision.weights.relay_app import relay_app

DOCUMENTATION = r"""
name: weights_relay
short_description: Path of the weight relay (relay.pyz), built from the collection's sources
description:
  - The stdlib-only relay that moves weights host to host, as one zipapp built from the
    collection's module_utils/k2_weights package, reproducibly (the same sources give the same
    bytes). The k2_weights role copies it to every host.
author: k2provision
"""


class LookupModule(LookupBase):  # type: ignore[misc]  # Ansible's base class is untyped
    def run(self, terms: list[Any], variables: Any = None, **kwargs: Any) -> list[str]:
        return [str(relay_app())]

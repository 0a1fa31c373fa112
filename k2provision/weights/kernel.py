"""The weights kernel under a short name.

Its one copy lives in the collection's module_utils (``plugins/module_utils/k2_weights``),
because Ansible modules can carry only module_utils to the hosts; see that package's
docstring. The k2provision package and the controller plugins import it from here.
"""

from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.module_utils.k2_weights import (  # noqa: E501
    checkpoint,
    common,
    events,
    hashing,
    manifest,
    names,
    safetensors,
    store,
    synthetic,
)

__all__ = [
    "checkpoint",
    "common",
    "events",
    "hashing",
    "manifest",
    "names",
    "safetensors",
    "store",
    "synthetic",
]

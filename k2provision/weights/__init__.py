"""Model weights: manifests, the relay as one file (relay_app), the weights command.

The helpers and the relay itself are the weights kernel in the collection's module_utils
(``kernel`` imports it here under a short name).

May import: ``k2provision.core``, ``k2provision.run`` (the live view), the collection's
weights kernel under ``k2provision.ansible`` and ``k2provision.errors``.
"""

"""Model weights: manifests, the relay as one file (relay_app), the weights command.

The helpers and the relay itself are the weights kernel in the collection's module_utils
(``kernel`` imports it here under a short name).
"""

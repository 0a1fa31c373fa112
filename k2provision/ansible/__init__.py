"""Ansible plugins that let ansible-playbook compute the same Plan as the k2provision CLI.

May import: ``k2provision.core``, ``k2provision.engines``, ``k2provision.plan``,
``k2provision.ops``, ``k2provision.weights`` and ``k2provision.errors``; nothing from run/ or
commands/ (the playbooks are the second door, not a caller of the first).
"""

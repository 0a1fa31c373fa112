"""Day-two operations over SSH: the transport, what status, logs, restart, verify and bench ask.

May import: ``k2provision.core``, ``k2provision.engines`` (what an engine declares),
``k2provision.plan`` and ``k2provision.errors`` (and Ansible's ssh connection plugin in
connect.py); nothing from run/ or commands/.
"""

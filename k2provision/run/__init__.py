"""The controller's side of a run: ansible-runner, its events, the terminal display, files on disk.

May import: ``k2provision.core``, ``k2provision.engines``, ``k2provision.plan``,
``k2provision.ops`` and ``k2provision.errors``; nothing from commands/.
"""

"""The k2provision commands: one module per command, each with `register(app)`.

A command module parses its options, calls the core or the shared run flow (flow.py) and
returns an exit code; cli.py lists the modules in its registry. Adding a command is a new
module here, imported and listed in cli.COMMANDS.

May import: every other sub-package; nothing imports commands/ but cli.py (and the lab's
own command, through the ``k2provision.commands`` entry points).
"""

"""The plan: pool shapes, the memory fit, the fixes that work, and its assembly into a Plan.

Pure. May import: ``k2provision.core``, ``k2provision.engines`` and ``k2provision.errors``,
and the collection's module_utils (the code that runs on the hosts too, standard library only:
the registry of host questions); nothing from ops/, run/ or commands/.
"""

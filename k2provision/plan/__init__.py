"""The plan: pool shapes, the memory fit, the fixes that work, and its assembly into a Plan.

Pure. May import: ``k2provision.core``, ``k2provision.engines`` and ``k2provision.errors``;
nothing from ops/, run/ or commands/.
"""

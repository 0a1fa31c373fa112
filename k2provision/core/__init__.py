"""The pure core: inventory -> Cluster, the records, the catalog, host facts and their verdicts.

May import: the standard library, pydantic/yaml/jinja2, ansible's inventory loader, and
``k2provision.errors`` and ``k2provision.core`` itself; nothing from engines/, plan/, ops/,
run/ or commands/.
"""

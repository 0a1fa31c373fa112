"""Lab hosts only: a bytecode cache for modules Python imports from zip files.

Python compiles a module it imports from a zip file from source on every import (zipimport
writes no .pyc). Ansible runs each task's module from such a zip (its AnsiballZ payload), so
on a lab host every task compiles the same ansible.module_utils sources again: about a third
of the CPU a module run costs, and the lab runs thousands of them on one machine. This keeps
each compiled module by the digest of its source under CACHE and loads it from there when the
same source comes again, with the file name of the zip it came from this time. What a module
does is unchanged: its code object is the one compile() returns for that source.

Installed on every lab host by k2lab (a .pth line in dist-packages imports it); never part
of the product or of the hosts it provisions.
"""

import marshal
import os
import sys
import zipimport
from types import CodeType

CACHE = "/var/cache/k2lab-zipimport"
_compile_source = zipimport._compile_source  # type: ignore[attr-defined]


def _renamed(code: CodeType, filename: str) -> CodeType:
    consts = tuple(_renamed(c, filename) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _cached_compile(pathname: str, source: bytes) -> CodeType:
    """zipimport's compile step, through the cache."""
    import hashlib

    key = hashlib.blake2b(source, digest_size=20).hexdigest()
    path = os.path.join(CACHE, f"{key}.{sys.implementation.cache_tag}")
    try:
        with open(path, "rb") as file:
            cached = marshal.load(file)
        if isinstance(cached, CodeType):
            return _renamed(cached, pathname)
    except (OSError, EOFError, ValueError, TypeError):
        pass
    code: CodeType = _compile_source(pathname, source)
    try:
        os.makedirs(CACHE, exist_ok=True)
        part = f"{path}.{os.getpid()}"
        with open(part, "wb") as file:
            marshal.dump(code, file)
        os.replace(part, path)
    except OSError:
        pass
    return code


zipimport._compile_source = _cached_compile  # type: ignore[attr-defined]

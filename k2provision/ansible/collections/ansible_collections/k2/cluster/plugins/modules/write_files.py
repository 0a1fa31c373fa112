"""Module k2.cluster.write_files: write a host's rendered files in one call."""

from __future__ import annotations

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: write_files
short_description: Write a host's rendered files in one call (root-owned, atomic)
description:
  - Writes each file whose content or mode differs (its directory made 0755 first), through a
    temporary file renamed into place, owned by root. Files already as given are left alone.
  - In check mode it writes nothing and reports what it would write.
options:
  files:
    description: The files (path, content, mode as an octal string).
    type: list
    elements: dict
    required: true
author: k2provision
"""

RETURN = r"""
written:
  description: The paths written (or, in check mode, that would be).
  type: list
  elements: str
"""


def _same(path: str, content: bytes, mode: int) -> bool:
    try:
        with open(path, "rb") as handle:
            same = handle.read() == content
        return same and (os.stat(path).st_mode & 0o7777) == mode
    except OSError:
        return False


def _write(path: str, content: bytes, mode: int) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, scratch = tempfile.mkstemp(dir=directory, prefix=".k2-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        os.chmod(scratch, mode)
        os.chown(scratch, 0, 0)
        os.replace(scratch, path)
    except BaseException:
        if os.path.exists(scratch):
            os.unlink(scratch)
        raise


def main() -> None:
    module = AnsibleModule(
        argument_spec={"files": {"type": "list", "elements": "dict", "required": True}},
        supports_check_mode=True,
    )
    written = []
    for entry in module.params["files"]:
        path = str(entry["path"])
        content = str(entry["content"]).encode()
        mode = int(str(entry["mode"]), 8)
        if _same(path, content, mode):
            continue
        written.append(path)
        if not module.check_mode:
            try:
                _write(path, content, mode)
            except OSError as error:
                module.fail_json(msg=f"{path}: {error}; fix: check the disk and its permissions")
    module.exit_json(changed=bool(written), written=written)


if __name__ == "__main__":
    main()

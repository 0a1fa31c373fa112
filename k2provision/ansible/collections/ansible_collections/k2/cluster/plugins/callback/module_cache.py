"""Callback k2.cluster.module_cache: module payloads kept between runs (k2provision/ansible/
module_cache.py says how and why)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import ansible
from ansible import constants as C
from ansible.plugins.callback import CallbackBase
from ansible.release import __version__ as ansible_version
from ansible.utils.collection_loader import AnsibleCollectionConfig

from k2provision.ansible import module_cache

DOCUMENTATION = r"""
name: module_cache
type: aggregate
short_description: Keep module payloads between runs, keyed by the code they are built from
description:
  - Ansible builds each module's payload (the module and the module_utils it imports) once per
    run and deletes it at the end. This callback points the run's payload cache at a directory
    that outlives the run, named by a digest of ansible-core's and Python's versions and of
    every module and module_utils file the run can load, so unchanged code is not parsed again
    and any change starts a new directory.
  - K2_MODULE_CACHE_DIR names where the directories live (default
    ~/.cache/k2provision/ansiballz); C(off) turns the cache off.
requirements:
  - enabled in callbacks_enabled (the project's ansible.cfg does)
author: k2provision
"""


class CallbackModule(CallbackBase):  # type: ignore[misc]  # Ansible's base class is untyped
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "k2.cluster.module_cache"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._linked = False

    def v2_playbook_on_start(self, playbook: Any) -> None:
        """Before the first task of the run: link its payload cache (once per run)."""
        if self._linked:
            return
        self._linked = True
        root = module_cache.cache_root(os.environ)
        if root is None:
            return
        basedir = Path(playbook._basedir)
        dirs = module_cache.module_dirs(
            Path(ansible.__file__).parent,
            AnsibleCollectionConfig.collection_paths,
            [*C.DEFAULT_MODULE_PATH, *C.DEFAULT_MODULE_UTILS_PATH,
             str(basedir / "library"), str(basedir / "module_utils")],
            C.DEFAULT_ROLES_PATH,
        )  # fmt: skip
        digest = module_cache.tree_digest(dirs, module_cache.runtime_versions(ansible_version))
        target = module_cache.link_run_cache(Path(C.DEFAULT_LOCAL_TMP), root, digest)
        if target is not None:
            self._display.vvv(f"module payloads: {target}")

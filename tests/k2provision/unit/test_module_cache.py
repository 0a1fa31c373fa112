"""Module payloads kept between runs (k2provision/ansible/module_cache.py and the callback
k2.cluster.module_cache): the digest follows the sources, old directories go, and real
ansible-playbook runs reuse a payload while its code is unchanged and build a new one when the
module changes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from k2provision.ansible import module_cache as mc

ROOT = Path(__file__).resolve().parents[3]
OURS = ROOT / "k2provision" / "ansible" / "collections"
MODULE = """#!/usr/bin/python
from ansible.module_utils.basic import AnsibleModule

def main():
    AnsibleModule(argument_spec={}).exit_json(changed=False, said="{said}")

if __name__ == "__main__":
    main()
"""


def test_the_cache_root_follows_the_environment(tmp_path: Path) -> None:
    assert mc.cache_root({mc.CACHE_ENV: "off"}) is None
    assert mc.cache_root({mc.CACHE_ENV: str(tmp_path)}) == tmp_path
    assert mc.cache_root({"XDG_CACHE_HOME": "/x"}) == Path("/x/k2provision/ansiballz")


def test_the_digest_changes_with_any_file_and_with_the_versions(tmp_path: Path) -> None:
    library = tmp_path / "library"
    library.mkdir()
    (library / "a.py").write_text("one")
    first = mc.tree_digest([library, tmp_path / "missing"], ["ansible-core 2.19"])
    assert mc.tree_digest([library], ["ansible-core 2.19"]) == first
    assert mc.tree_digest([library], ["ansible-core 2.20"]) != first
    (library / "__pycache__").mkdir()
    (library / "__pycache__" / "a.cpython-311.pyc").write_text("compiled")
    assert mc.tree_digest([library], ["ansible-core 2.19"]) == first
    (library / "a.py").write_text("two!")
    assert mc.tree_digest([library], ["ansible-core 2.19"]) != first


def test_prune_keeps_the_current_the_newest_and_the_young(tmp_path: Path) -> None:
    now = 10 * mc.MIN_AGE_S
    for age, name in enumerate("abcdefg"):
        path = tmp_path / name
        path.mkdir()
        os.utime(path, (now - age * mc.MIN_AGE_S, now - age * mc.MIN_AGE_S))
    (tmp_path / "young").mkdir()
    os.utime(tmp_path / "young", (now - 100, now - 100))
    mc.prune(tmp_path, tmp_path / "g", keep=2, now=now)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "g", "young"]


def test_a_run_links_its_cache_once_and_never_over_its_own(tmp_path: Path) -> None:
    run_tmp = tmp_path / "run"
    run_tmp.mkdir()
    target = mc.link_run_cache(run_tmp, tmp_path / "root", "d1")
    assert target == tmp_path / "root" / "d1"
    assert (run_tmp / mc.RUN_CACHE_NAME).resolve() == target
    assert mc.link_run_cache(run_tmp, tmp_path / "root", "d2") is None


def test_ansible_playbook_reuses_a_payload_and_rebuilds_a_changed_module(
    tmp_path: Path,
) -> None:
    collections = tmp_path / "collections"
    module = collections / "ansible_collections" / "t" / "c" / "plugins" / "modules" / "say.py"
    module.parent.mkdir(parents=True)
    (module.parents[2] / "galaxy.yml").write_text("namespace: t\nname: c\nversion: 1.0.0\n")
    module.write_text(MODULE.replace("{said}", "one"))
    config = tmp_path / "ansible.cfg"
    config.write_text(
        "[defaults]\ncallbacks_enabled = k2.cluster.module_cache\n"
        f"collections_path = {collections}:{OURS}\n"
    )
    playbook = tmp_path / "say.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - t.c.say:\n      register: said\n"
        "    - ansible.builtin.debug:\n        msg: 'said {{ said.said }}'\n"
    )
    cache = tmp_path / "cache"
    env = {**os.environ, "ANSIBLE_CONFIG": str(config), mc.CACHE_ENV: str(cache)}

    def run() -> str:
        out = subprocess.run(
            [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,",
             "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}", str(playbook)],
            capture_output=True, text=True, env=env, timeout=120, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    assert "said one" in run()
    (first,) = cache.iterdir()
    payload = first / "ansible_collections.t.c.plugins.modules.say-ZIP_DEFLATED-none"
    built = payload.stat()
    assert "said one" in run()
    assert (payload.stat().st_ino, payload.stat().st_mtime_ns) == (built.st_ino, built.st_mtime_ns)

    module.write_text(MODULE.replace("{said}", "two, changed"))
    assert "said two, changed" in run()
    assert len(list(cache.iterdir())) == 2

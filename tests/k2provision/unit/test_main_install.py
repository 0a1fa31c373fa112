"""The README's main install alone (no test extra) carries everything the playbooks need."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PLAYBOOKS = sorted((ROOT / "playbooks").glob("*.yml"))
# Collections the product ships or ansible-core carries; anything else would need an install
# the README's main command does not do.
AVAILABLE = ("ansible.builtin.", "k2.cluster.")
FQCN_TASK_KEY = re.compile(r"^\s*-?\s*([a-z0-9_]+\.[a-z0-9_]+\.[a-z0-9_]+):", re.MULTILINE)


def task_files() -> list[Path]:
    return sorted(
        [*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("roles/*/handlers/*.yml"), *PLAYBOOKS]
    )


def test_roles_and_playbooks_use_only_modules_the_main_install_has() -> None:
    used = {
        (path.relative_to(ROOT).as_posix(), name)
        for path in task_files()
        for name in FQCN_TASK_KEY.findall(path.read_text())
    }
    assert used, "no FQCN module found: the pattern is wrong"
    foreign = sorted((path, name) for path, name in used if not name.startswith(AVAILABLE))
    assert foreign == []


@pytest.mark.parametrize("playbook", PLAYBOOKS, ids=lambda p: p.name)
def test_every_playbook_loads_with_the_main_install_alone(
    main_install: Path, playbook: Path
) -> None:
    out = subprocess.run(
        [
            str(main_install / "ansible-playbook"),
            "--syntax-check",
            "-i",
            str(ROOT / "inventory" / "prod.ini"),
            str(playbook),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": f"{main_install}:{os.environ['PATH']}"},
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]

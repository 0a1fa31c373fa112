"""The lab's client image pins what SGLang's benchmark client loads: every distribution that
`import sglang.benchmark.serving` takes a module or a shared library from in the parsers' sglang
venv is in k2lab/standin_client/requirements.txt, and the ones scripts/install-engine-parsers
pins exactly (sglang, torch, torchvision, transformers) at that venv's versions. The rest are
pinned at the versions that venv resolved when the list was written (it resolves them anew on
each install, so their versions are not compared); the image build's own import check proves
the pinned set imports (k2lab.standin.build_standin_client, run by the bastion lab test)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from k2lab.standin import client_dir
from tests.engine_parsers.runner import venv_python

pytestmark = pytest.mark.parsers

# Run in the venv: the distributions (name -> version) whose files the client's import loads,
# as modules or as mapped shared libraries (not what the interpreter loaded before it, such as
# setuptools' distutils hook, which a venv's site-packages starts).
LOADED = r"""
import importlib.metadata as md, json, os, sys
before = set(sys.modules)
import sglang.benchmark.serving
site = next(p for p in sys.path if p.endswith("site-packages"))
files = {os.path.relpath(m.__file__, site) for n, m in list(sys.modules.items())
         if n not in before and getattr(m, "__file__", None) and m.__file__.startswith(site)}
with open("/proc/self/maps") as maps:
    for line in maps:
        path = line.split()[-1]
        if path.startswith(site):
            files.add(os.path.relpath(path, site))
owner = {}
for dist in md.distributions(path=[site]):
    for f in dist.files or ():
        owner[str(f)] = (dist.metadata["Name"], dist.version)
print(json.dumps(dict(owner[f] for f in files if f in owner)))
"""


EXACT = ("sglang", "torch", "torchvision", "transformers")
"""The client's distributions scripts/install-engine-parsers pins with ==."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned() -> dict[str, str]:
    pins = {}
    for raw in (client_dir() / "requirements.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"requirements.txt: {line!r} is not pinned with =="
            pins[canonical(name)] = version
    return pins


def test_the_client_image_pins_what_the_client_loads() -> None:
    done = subprocess.run(
        [str(venv_python("sglang")), "-W", "ignore", "-c", LOADED],
        capture_output=True, text=True, timeout=600, env={"HF_HUB_OFFLINE": "1",
                                                          "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = {canonical(n): v for n, v in json.loads(done.stdout.splitlines()[-1]).items()}
    pins = pinned()
    assert sorted(set(loaded) - set(pins)) == []
    for name in EXACT:
        assert (name, pins[name]) == (name, loaded[name])

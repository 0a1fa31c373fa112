"""The lab's client image (k2lab/standin_client) pins the client `k2provision bench` runs for
SGLang plans at the engine's own pin, and torch, torchvision and transformers as the parsers'
sglang venv pins them (scripts/install-engine-parsers), so the image's client is the one the
parser checks read. Every pin is exact and names a wheel distribution once. Whether the pinned
set imports is the image build's own check (its Containerfile's RUN), which the bastion lab test
runs."""

from __future__ import annotations

import re
from pathlib import Path

from k2lab.standin import client_dir
from k2provision.engines import sglang

REPO_ROOT = Path(__file__).resolve().parents[2]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    found: dict[str, str] = {}
    for raw in (client_dir() / "requirements.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep, f"{line}: not pinned with =="
        assert re.fullmatch(r"[0-9][0-9A-Za-z.+]*", version), line
        assert canonical(name) not in found, f"{name} pinned twice"
        found[canonical(name)] = version
    return found


def script_pin(variable: str) -> str:
    text = (REPO_ROOT / "scripts" / "install-engine-parsers").read_text()
    match = re.search(rf"^{variable}=(\S+)$", text, re.MULTILINE)
    assert match, variable
    return match.group(1)


def test_the_client_image_pins_the_engines_client_and_the_parsers_torch() -> None:
    pinned = pins()
    engine_pin = sglang.BENCH_CLIENT.install.split()[0]  # "sglang==0.5.23 (...)"
    assert f"sglang=={pinned['sglang']}" == engine_pin
    assert pinned["sglang"] == script_pin("SGLANG_VERSION")
    assert pinned["torch"] == script_pin("SGLANG_TORCH_VERSION")
    assert pinned["torchvision"] == script_pin("SGLANG_TORCHVISION_VERSION")
    text = (REPO_ROOT / "scripts" / "install-engine-parsers").read_text()
    assert f'"transformers=={pinned["transformers"]}"' in text

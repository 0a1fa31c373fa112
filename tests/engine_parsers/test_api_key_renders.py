"""The single SGLang server's API key, through the real sglang 0.5.23 parser (and
KTransformers' sglang-kt 0.7.2, which reads it the same way): the rendered
`--config` file, written as the launch phase writes it (roles/k2_launch/tasks/guard.yml: the
JSON of {"api-key": KEY}), sets the server's api_key, and the argv holds no key. Needs
.venv-sglang and .venv-sglang-kt from scripts/install-engine-parsers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k2provision.core.endpoint_guard import API_KEY_YAML, guard_path
from k2provision.core.templating import with_host_values
from k2provision.plan.assemble import build_plan
from tests.k2provision.access_support import GuardFiles

from . import goldens
from .runner import check

pytestmark = pytest.mark.parsers

KEY = "k2-test-key 0123: with a colon"  # YAML would misread it unquoted


@pytest.mark.parametrize(
    ("case", "engine"), [("sglang-tp", "sglang"), ("ktransformers", "sglang-kt")]
)
def test_the_sglang_server_takes_the_key_from_its_config_file(
    case: str, engine: str, tmp_path: Path, guard_files: GuardFiles
) -> None:
    cluster = goldens.cluster(case)
    key_file = {"api_key_file": guard_files.api_key}
    keyed = cluster.model_copy(update={"tunables": cluster.tunables.model_copy(update=key_file)})
    plan = build_plan(keyed)
    proc = next(p for p in plan.hosts[0].processes if p.argv[:3] == goldens.SGLANG_SERVER)
    proc = with_host_values(proc, goldens.SAMPLE_HOST_VALUES)
    on_host = guard_path(plan.config_dir, API_KEY_YAML)
    assert on_host in proc.argv
    assert KEY not in proc.argv
    config = tmp_path / "api_key.yaml"
    config.write_text(json.dumps({"api-key": KEY}) + "\n")
    argv = [str(config) if a == on_host else a for a in proc.argv]
    result = check(engine, argv, dict(proc.env), options=goldens.OPTIONS[engine])
    assert result.ok, f"{result.stage}: {result.error}"
    assert result.value("api_key") == KEY
    unkeyed = goldens.verdict(goldens.Launch(case, plan.hosts[0].name, proc.name))
    assert unkeyed.value("api_key") is None

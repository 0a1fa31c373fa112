"""Where a plan's images come from: pulled as named, or built from containers/ under a tag
that follows the build's content."""

from __future__ import annotations

from pathlib import Path

import pytest

from k2provision.engines import trtllm, vllm
from k2provision.errors import PlanError
from k2provision.plan import images


@pytest.fixture
def containers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(images, "CONTAINERS_DIR", tmp_path)
    images.build_digest.cache_clear()
    (tmp_path / "router").mkdir()
    (tmp_path / "router" / "Containerfile").write_text("FROM python:3.12-slim\n")
    yield tmp_path
    images.build_digest.cache_clear()


def test_the_tag_follows_the_build_files_content(containers: Path) -> None:
    first = images.build_tag("router", "0.3.2")
    assert first.startswith("k2provision/router:0.3.2-")
    images.build_digest.cache_clear()
    assert images.build_tag("router", "0.3.2") == first  # same sources, same tag
    (containers / "router" / "Containerfile").write_text("FROM python:3.13-slim\n")
    images.build_digest.cache_clear()
    assert images.build_tag("router", "0.3.2") != first
    images.build_digest.cache_clear()
    (containers / "router" / "extra.txt").write_text("x")
    assert images.build_tag("router", "0.3.2") != first


def test_a_missing_build_directory_is_said_plainly(containers: Path) -> None:
    with pytest.raises(PlanError, match="containers/nothing-here") as raised:
        images.build_digest("nothing-here")
    assert "fix: " in str(raised.value)


def test_every_shipped_build_has_a_containerfile() -> None:
    images.build_digest.cache_clear()
    for build in ("router", "trtllm", "ktransformers"):
        assert len(images.build_digest(build)) == 64
    assert trtllm.RELEASE.build == "trtllm"
    assert vllm.RELEASE.build == ""  # published as it runs
    assert set(images.built_images(trtllm.RELEASE).values()) == {"router", "trtllm"}
    assert set(images.built_images(vllm.RELEASE).values()) == {"router"}

"""The lab dir can live in a cache shared by many runs (scripts/test keeps it outside the
checkout): a rootfs counts as built only when it is complete and from the current recipe, so a
half-built, interrupted or stale one is rebuilt. No root needed: only the markers are read."""

from __future__ import annotations

import json
from pathlib import Path

from k2lab.config import LabConfig
from k2lab.rootfs import base_hash, is_current, recipe_hash


def lab(tmp_path: Path) -> LabConfig:
    return LabConfig(lab_dir=tmp_path / "lab")


def complete(cfg: LabConfig, **marker: object) -> None:
    """A rootfs tree and its marker, as ensure_rootfs leaves them (the marker written last)."""
    (cfg.rootfs / "etc").mkdir(parents=True)
    fields = {"recipe": recipe_hash(), "base": base_hash(), **marker}
    cfg.rootfs_marker.write_text(json.dumps(fields))


def test_a_complete_rootfs_of_this_recipe_is_current(tmp_path: Path) -> None:
    cfg = lab(tmp_path)
    complete(cfg)
    assert is_current(cfg)


def test_an_empty_lab_dir_is_not_current(tmp_path: Path) -> None:
    assert not is_current(lab(tmp_path))


def test_a_build_cut_short_is_not_current(tmp_path: Path) -> None:
    # debootstrap runs in rootfs.partial and the marker comes last: a run killed before it
    # leaves a tree without a marker.
    cfg = lab(tmp_path)
    (cfg.lab_dir / "rootfs.partial" / "etc").mkdir(parents=True)
    assert not is_current(cfg)
    (cfg.rootfs / "etc").mkdir(parents=True)
    assert not is_current(cfg)


def test_a_marker_without_its_tree_is_not_current(tmp_path: Path) -> None:
    cfg = lab(tmp_path)
    complete(cfg)
    (cfg.rootfs / "etc").rmdir()
    cfg.rootfs.rmdir()
    assert not is_current(cfg)


def test_a_rootfs_of_another_recipe_is_not_current(tmp_path: Path) -> None:
    cfg = lab(tmp_path)
    complete(cfg, recipe="0" * 16)
    assert not is_current(cfg)


def test_a_damaged_marker_is_not_current(tmp_path: Path) -> None:
    cfg = lab(tmp_path)
    complete(cfg)
    cfg.rootfs_marker.write_text('{"recipe": ')
    assert not is_current(cfg)
    cfg.rootfs_marker.write_text(json.dumps([recipe_hash()]))
    assert not is_current(cfg)

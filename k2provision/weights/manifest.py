"""Manifests: the files of one model revision with their sizes and sha256.

A manifest is built once, either from a local directory (hashed here, several files in
parallel) or from Hugging Face hub metadata (the hub's LFS sha256 of every file), then
saved as JSON beside the weights and in the run records. The relay (relay.pyz) reads the
same JSON. The number and names of the shards come from the manifest alone.

No network here: ``hub_model_info`` imports huggingface_hub lazily (optional extra
``hub``) and hands the metadata to the pure ``manifest_from_hub_info``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from k2provision.core.records import Record
from k2provision.errors import K2Error
from k2provision.weights.kernel import common, hashing, names, safetensors
from k2provision.weights.kernel import manifest as kernel_manifest

MANIFEST_FORMAT: Literal["k2provision.manifest/1"] = "k2provision.manifest/1"
STORED_MANIFEST_NAME = common.STORED_MANIFEST
TOKEN_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


class ManifestError(K2Error):
    """A manifest cannot be built, read or trusted."""


class ManifestFile(Record):
    """One file of a model revision."""

    name: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str) -> str:
        try:
            names.check_name(name)
        except common.RelayError as exc:
            raise ValueError(str(exc)) from None
        return name


class Manifest(Record):
    """Files (in transfer order), sizes and sha256 of one model revision."""

    format: Literal["k2provision.manifest/1"] = MANIFEST_FORMAT
    model: str
    revision: str
    files: tuple[ManifestFile, ...]

    @model_validator(mode="after")
    def _unique(self) -> Manifest:
        seen: set[str] = set()
        for f in self.files:
            if f.name in seen:
                raise ValueError(f"{f.name!r} is listed twice")
            seen.add(f.name)
        return self

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.files)

    @property
    def shards(self) -> tuple[ManifestFile, ...]:
        """The safetensors files (their count is the model's shard count)."""
        return tuple(f for f in self.files if names.is_safetensors(f.name))

    def file(self, name: str) -> ManifestFile:
        for f in self.files:
            if f.name == name:
                return f
        raise KeyError(name)

    def select(self, patterns: Sequence[str]) -> Manifest:
        """Only the files matching any of the glob ``patterns``."""
        return self.model_copy(
            update={"files": tuple(f for f in self.files if names.matches(f.name, patterns))}
        )

    def to_json(self) -> str:
        return self.model_dump_json(indent=1) + "\n"

    def digest(self) -> str:
        """sha256 over (name, size, sha256) of every file: equal digests, equal contents."""
        return kernel_manifest.manifest_digest([f.model_dump(mode="json") for f in self.files])


class StoredManifest(Manifest):
    """The manifest kept beside the weights: verified files plus their mtime at verification."""

    stamps: dict[str, int] = Field(default_factory=dict)


# ----------------------------------------------------------------------------- safetensors


def safetensors_header_ok(
    source: Path | str | bytes | bytearray | memoryview, size: int | None = None
) -> bool:
    """True when a safetensors file's header adds up to its size.

    ``source`` is a path, or the file's first bytes (at least 8 + header length) with
    ``size`` the whole file's size (the kernel's check_safetensors_header does the work).
    """
    if isinstance(source, bytes | bytearray | memoryview):
        size = len(source) if size is None else size
        return safetensors.check_safetensors_header(source, size) is None
    return safetensors.check_safetensors_file(str(source), size) is None


# ----------------------------------------------------------------------------- JSON


def load_manifest(path: Path) -> Manifest:
    """Read a manifest JSON file; a clear error names the file and the problem."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ManifestError([f"{path}: cannot read the manifest ({exc})"]) from None
    return parse_manifest(data, source=str(path))


def parse_manifest(data: object, *, source: str = "manifest") -> Manifest:
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise ManifestError(_problems(source, exc)) from None


def load_stored_manifest(dest: Path) -> StoredManifest | None:
    """The manifest of verified files kept in ``dest`` by the relay, or None."""
    path = dest / STORED_MANIFEST_NAME
    if not path.exists():
        return None
    try:
        return StoredManifest.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValidationError) as exc:
        raise ManifestError([f"{path}: not a stored manifest ({exc.__class__.__name__})"]) from None


def save_manifest(manifest: Manifest, path: Path) -> Path:
    """Write atomically (temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(manifest.to_json(), encoding="utf-8")
    tmp.replace(path)
    return path


def _problems(source: str, exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top)"
        out.append(f"{source}: {where}: {err['msg']}")
    return out


# ----------------------------------------------------------------------------- local directory


natural_key = names.natural_key


def _hash_paths(paths: Iterable[Path], workers: int | None = None) -> dict[Path, str]:
    """The kernel's hash_files, keyed by Path."""
    digests = hashing.hash_files([str(p) for p in paths], workers or 0)
    return {Path(p): d for p, d in digests.items()}


def manifest_from_dir(
    directory: Path,
    *,
    model: str,
    revision: str,
    patterns: Sequence[str] | None = None,
    workers: int | None = None,
    check_headers: bool = True,
) -> Manifest:
    """Hash every (non-hidden) file under ``directory`` into a manifest.

    Safetensors headers are checked first; a shard whose header does not add up to its
    size is refused, since no host could ever verify it.
    """
    if not directory.is_dir():
        raise ManifestError([f"{directory}: not a directory"])
    found = names.list_files(str(directory), patterns)
    if not found:
        raise ManifestError([f"{directory}: no files match {list(patterns or ['*'])}"])
    if check_headers:
        problems = []
        for name in found:
            if names.is_safetensors(name):
                problem = safetensors.check_safetensors_file(str(directory / name))
                if problem:
                    problems.append(f"{directory / name}: safetensors {problem}")
        if problems:
            raise ManifestError(problems)
    digests = _hash_paths([directory / n for n in found], workers)
    files = tuple(
        ManifestFile(name=n, size=(directory / n).stat().st_size, sha256=digests[directory / n])
        for n in found
    )
    return Manifest(model=model, revision=revision, files=files)


# ----------------------------------------------------------------------------- the hub


def hub_token(env: Mapping[str, str] | None = None) -> str | None:
    """The Hugging Face token from the environment (never logged, never stored)."""
    source = os.environ if env is None else env
    for var in TOKEN_ENV_VARS:
        value = source.get(var, "").strip()
        if value:
            return value
    return None


def redact(text: str, secrets: Iterable[str | None]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def _field(obj: Any, *names: str) -> Any:
    """A key of a mapping or an attribute of an object (hub JSON or huggingface_hub records)."""
    for name in names:
        if isinstance(obj, Mapping):
            if name in obj:
                return obj[name]
        elif hasattr(obj, name):
            return getattr(obj, name)
    return None


def manifest_from_hub_info(
    info: Any,
    *,
    model: str | None = None,
    revision: str | None = None,
    allow_patterns: Sequence[str] | None = None,
    local_dir: Path | None = None,
    workers: int | None = None,
) -> Manifest:
    """Convert hub model metadata (``files_metadata=True``) into a manifest.

    ``info`` is a ``huggingface_hub`` ModelInfo or the hub API's JSON of the same shape
    (``id``, ``sha``, ``siblings`` with ``rfilename``, ``size`` and ``lfs.sha256``). LFS files
    take the hub's sha256. Small non-LFS files (config.json, tokenizer) have no sha256 in
    the metadata: they are hashed from ``local_dir`` (the downloaded copy), or refused.
    The revision recorded is the resolved commit, so a branch name cannot drift.
    """
    name_of_model = model or _field(info, "id", "modelId") or ""
    resolved = _field(info, "sha") or revision or ""
    siblings = _field(info, "siblings")
    if not isinstance(siblings, Iterable) or isinstance(siblings, str | bytes):
        raise ManifestError([f"{name_of_model}: hub metadata has no file list (siblings)"])
    lfs_files: list[ManifestFile] = []
    plain: list[tuple[str, int | None]] = []
    problems: list[str] = []
    for sib in siblings:
        name = _field(sib, "rfilename")
        if not isinstance(name, str) or not names.matches(name, allow_patterns):
            continue
        lfs = _field(sib, "lfs")
        sha = _field(lfs, "sha256") if lfs else None
        size = _field(lfs, "size") if lfs else None
        if size is None:
            size = _field(sib, "size")
        if sha:
            if not isinstance(size, int):
                problems.append(
                    f"{name}: the hub metadata has no size; ask for it with files_metadata=True"
                )
                continue
            try:
                lfs_files.append(ManifestFile(name=name, size=size, sha256=str(sha)))
            except ValidationError as exc:
                problems.extend(_problems(f"{name_of_model}/{name}", exc))
        else:
            plain.append((name, size if isinstance(size, int) else None))
    files = list(lfs_files)
    if plain:
        if local_dir is None:
            problems.extend(
                f"{name}: not stored in LFS, so the hub gives no sha256 for it; download it and"
                f" pass local_dir, or leave it out with allow_patterns (e.g. '*.safetensors')"
                for name, _ in plain
            )
        else:
            present = [(n, s) for n, s in plain if (local_dir / n).is_file()]
            problems.extend(
                f"{local_dir / n}: missing (download it before building the manifest)"
                for n, _ in plain
                if not (local_dir / n).is_file()
            )
            digests = _hash_paths([local_dir / n for n, _ in present], workers)
            for n, hub_size in present:
                size = (local_dir / n).stat().st_size
                if hub_size is not None and hub_size != size:
                    problems.append(f"{local_dir / n}: {size} bytes, the hub says {hub_size}")
                    continue
                files.append(ManifestFile(name=n, size=size, sha256=digests[local_dir / n]))
    if problems:
        raise ManifestError(problems)
    if not files:
        wanted = list(allow_patterns or ["*"])
        raise ManifestError([f"{name_of_model}@{resolved}: no hub file matches {wanted}"])
    files.sort(key=lambda f: natural_key(f.name))
    return Manifest(model=str(name_of_model), revision=str(resolved), files=tuple(files))


def hub_model_info(repo: str, revision: str, token: str | None = None, api: Any = None) -> Any:
    """The hub's metadata of ``repo`` at ``revision`` (``files_metadata=True``): the one place
    that asks the hub. The token goes to the hub client only; any error text is scrubbed of it.
    """
    if api is None:
        try:
            from huggingface_hub import HfApi
        except ImportError:
            raise ManifestError(
                [
                    "huggingface_hub is not installed on the controller; fix: pip install "
                    "'k2provision[hub]' (or huggingface_hub) in the controller's environment"
                ]
            ) from None
        api = HfApi()
    try:
        return api.model_info(repo, revision=revision, files_metadata=True, token=token)
    except Exception as exc:  # the hub client raises many types; all end here, scrubbed
        text = redact(f"{exc.__class__.__name__}: {exc}", [token])
        raise ManifestError([f"{repo}@{revision}: cannot read hub metadata ({text})"]) from None


def fetch_hub_manifest(
    repo: str,
    revision: str,
    *,
    token: str | None = None,
    allow_patterns: Sequence[str] | None = None,
    local_dir: Path | None = None,
    api: Any = None,
) -> Manifest:
    """Ask the hub for ``repo`` at ``revision`` (metadata only) and build its manifest."""
    info = hub_model_info(repo, revision, token, api)
    return manifest_from_hub_info(
        info, model=repo, revision=revision, allow_patterns=allow_patterns, local_dir=local_dir
    )

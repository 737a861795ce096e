"""A leaderboard submission: a folder with ``submission.yaml`` (name, authors, description, whether it learns, the
controller spec and its arguments) and the files the controller needs, or a single ``file.py:Class``.

The controller spec is what ``commitenv run --controller`` takes, read relative to the folder: ``file.py:Class``,
``module:Class`` (a module in the folder or an installed package), ``sb3:DIR`` (a trained policy in the folder), or a
registered name (a built-in or an installed package's entry point). The host never imports submission code: it only
reads this metadata and hashes the files; the code runs in the sandbox.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from commitenv.leaderboard.suite import load_yaml_model

META_FILE = "submission.yaml"
MAX_BYTES = 64 << 20  # a submission folder's size limit
_SKIP = {"__pycache__", ".git", ".ipynb_checkpoints"}


class SubmissionMeta(BaseModel):
    """The fields of ``submission.yaml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
    authors: list[str] = Field(min_length=1)
    description: str = ""
    learns: bool = False
    controller: str = Field(min_length=1)
    kwargs: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True)
class Submission:
    """A loaded submission: its metadata, its folder (None for a registered name alone), the files to copy into
    the sandbox, relative to the folder, and their hash."""

    meta: SubmissionMeta
    folder: Path | None
    files: tuple[str, ...] = field(default=())
    sha256: str = ""

    @property
    def name(self) -> str:
        return self.meta.name


def _files(folder: Path) -> list[str]:
    out, total = [], 0
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP)
        for f in sorted(filenames):
            p = Path(dirpath) / f
            if p.is_symlink() or not p.is_file():
                continue
            total += p.stat().st_size
            if total > MAX_BYTES:
                raise ValueError(f"{folder}: the submission holds more than {MAX_BYTES >> 20} MiB")
            out.append(str(p.relative_to(folder)))
    return out


def _hash(folder: Path, files: list[str]) -> str:
    h = hashlib.sha256()
    for rel in files:
        h.update(rel.encode() + b"\0")
        h.update((folder / rel).read_bytes())
        h.update(b"\0")
    return "sha256:" + h.hexdigest()


def load_submission(path: str | Path, *, name: str | None = None, authors: list[str] | None = None,
                    description: str | None = None, learns: bool | None = None) -> Submission:
    """Read a submission (a folder with ``submission.yaml``, that file itself, or ``file.py:Class`` with the
    metadata given as arguments); the arguments override the file's fields. ValueError naming what is wrong."""
    text = str(path)
    override = {k: v for k, v in {"name": name, "authors": authors, "description": description,
                                  "learns": learns}.items() if v is not None}
    if ".py:" in text and not Path(text).exists():
        file, _, cls = text.rpartition(":")
        fpath = Path(file)
        if not fpath.is_file():
            raise ValueError(f"submission {text}: file {file} not found")
        doc: dict[str, Any] = {"name": name or fpath.stem, "authors": authors or ["anonymous"],
                               "controller": f"{fpath.name}:{cls}"}
        doc.update({k: v for k, v in override.items() if k != "name"})
        meta = _validate(doc, text)
        return Submission(meta, fpath.parent.resolve(), (fpath.name,), _hash(fpath.parent, [fpath.name]))
    p = Path(text)
    meta_path = p / META_FILE if p.is_dir() else p
    if not meta_path.is_file():
        raise ValueError(f"submission {text}: expected a folder with {META_FILE}, a {META_FILE} file, or "
                         "file.py:Class")
    meta, _ = load_yaml_model(meta_path, SubmissionMeta, "submission", override)
    folder = meta_path.parent.resolve()
    files = _files(folder)
    return Submission(meta, folder, tuple(files), _hash(folder, files))


def _validate(doc: dict[str, Any], where: str) -> SubmissionMeta:
    try:
        return SubmissionMeta.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        raise ValueError(f"{where}: field {'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None


def sandbox_spec(sub: Submission, root: Path) -> str:
    """The controller spec as the sandbox resolves it, with ``root/submission`` holding the copied files."""
    spec = sub.meta.controller
    here = root / "submission"
    if spec.startswith("sb3:"):
        where = spec[4:].strip()
        return f"sb3:{here / where}" if (here / where).exists() else spec
    where, sep, cls = spec.rpartition(":")
    if sep and (where.endswith(".py") or "/" in where) and not Path(where).is_absolute():
        return f"{here / where}:{cls}"
    return spec

"""A project's syncpass configuration: ``[tool.syncpass]`` in ``pyproject.toml``, or a TOML file.

One table configures every way in (``plan``, ``rewrite``, ``check`` and the
pre-commit hook)::

    [tool.syncpass]
    strategy = "adaptive"                  # the sync_config vocabulary (syncpass.contracts.config)
    min_sync_interval = 2
    communication_cost_threshold = 0.1
    backend = "torch_stages"               # what the sync points are written for
    stages = 4                             # or "auto"; pipeline ranks
    schedule = "interleaved-1f1b"          # the schedule plans are predicted (and checked) for
    stages_per_device = 2                  # or "auto"; the stages each rank holds
    hardware = "pcie4-gpus"                # a shipped profile, or a .toml file

    [[tool.syncpass.models]]               # one per generated file `syncpass check` keeps current
    source = "models/gpt.py"
    generated = "models/gpt_pipeline.py"
    costs = "models/gpt.costs.json"
    stages = 8                             # overrides the stages above
    model = "GPT"                          # the class, when the file has several

Paths are relative to the folder of the file that names them, and must resolve
(symlinks followed) inside the project: the folder of the ``pyproject.toml``, or for a
TOML file of its own the nearest folder above it with a ``pyproject.toml`` or ``.git``
(a config file never makes syncpass read or write elsewhere). A file found by
:func:`find_project_config` is the nearest ``pyproject.toml`` with a
``[tool.syncpass]`` table, walking up from where a command starts (as ruff
does). Unknown keys are errors that list the valid ones and name the file,
line and table. This module imports neither torch nor libcst.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syncpass.contracts.config import (
    CONFIG_KEYS,
    SCHEDULES,
    SyncConfig,
    default_sync_config,
    read_config_table,
    sync_config_from_mapping,
)
from syncpass.contracts.hardware import profile_names
from syncpass.core.errors import SyncpassError
from syncpass.core.plugins import DEFAULT_BACKEND, backend_names

#: Backends the sync points can be written for. ``torch``: ``pipe_split()`` calls
#: of ``torch.distributed.pipelining``.
#: Keys of the project table besides the sync settings.
PROJECT_KEYS = ("backend", "stages", "schedule", "stages_per_device", "hardware", "models")
#: Keys of one ``[[tool.syncpass.models]]`` entry.
MODEL_KEYS = ("source", "generated", "costs", "stages", "model")
_REQUIRED_MODEL_KEYS = ("source", "generated", "costs")

#: A stage count, or ``"auto"``: the count with the least predicted step time.
Stages = int | str


@dataclass(frozen=True)
class ModelEntry:
    """A model whose generated (pipelined) source ``syncpass check`` keeps current.

    ``generated`` must be what ``syncpass rewrite SOURCE --costs COSTS --stages
    STAGES`` writes; ``stages`` of ``None`` takes the project's. ``location``
    is where the entry stands (``pyproject.toml:12``), for messages.
    """

    source: Path
    generated: Path
    costs: Path
    stages: Stages | None = None
    model: str | None = None
    location: str = ""

    def __post_init__(self) -> None:
        if self.source == self.generated:
            raise ValueError(
                f"source and generated are the same file ({self.source}); the generated file "
                "is written from the source, so give it a name of its own"
            )
        if self.stages is not None:
            _check_stages(self.stages)

    @property
    def files(self) -> tuple[Path, Path, Path]:
        """The files the entry depends on or writes: source, generated, costs."""
        return (self.source, self.generated, self.costs)


@dataclass(frozen=True)
class ProjectConfig:
    """The settings of one config file (or the defaults, with ``path`` of ``None``).

    ``sync`` is the default settings with the file's applied; ``sync_keys``
    names those the file sets, which is what :meth:`sync_over` lays over
    another base (a cost file's settings).
    """

    path: Path | None = None
    sync: SyncConfig = field(default_factory=default_sync_config)
    sync_keys: tuple[str, ...] = ()
    backend: str = DEFAULT_BACKEND
    stages: Stages | None = None
    hardware: str | None = None
    models: tuple[ModelEntry, ...] = ()
    schedule: str | None = None
    stages_per_device: Stages | None = None
    stages_per_device_at: str = ""  # where the file sets it (file:line), for messages

    def __post_init__(self) -> None:
        unknown = set(self.sync_keys) - set(CONFIG_KEYS)
        if unknown:
            raise ValueError(f"sync_keys must be among {', '.join(CONFIG_KEYS)}")
        if self.backend not in backend_names():
            raise ValueError(
                f"backend must be one of {', '.join(backend_names())}, got {self.backend!r}"
            )
        if self.stages is not None:
            _check_stages(self.stages)

    def sync_over(self, base: SyncConfig) -> SyncConfig:
        """``base`` with the settings this file sets (flags go over the result)."""
        return base.replace(**{key: getattr(self.sync, key) for key in self.sync_keys})

    def stages_for(self, entry: ModelEntry) -> Stages | None:
        """The entry's stage count, else the project's."""
        return entry.stages if entry.stages is not None else self.stages

    def entry_for(self, path: Path) -> ModelEntry | None:
        """The model entry whose source (or cost file) ``path`` is, if any."""
        try:
            wanted = path.resolve()
        except OSError:
            return None
        for entry in self.models:
            if wanted in (entry.source.resolve(), entry.costs.resolve()):
                return entry
        return None


def _check_stages(stages: object, key: str = "stages") -> None:
    if stages == "auto":
        return
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ValueError(f'{key} must be a whole number >= 1 or "auto", got {stages!r}')


def find_project_config(start: Path) -> Path | None:
    """The nearest ``pyproject.toml`` with a ``[tool.syncpass]`` table, from ``start`` up.

    ``start`` is a file or a folder. A ``pyproject.toml`` without the table is
    passed over, as ruff passes over files without ``[tool.ruff]``.
    """
    start = start.resolve()
    folders = [start, *start.parents] if start.is_dir() else list(start.parents)
    for folder in folders:
        candidate = folder / "pyproject.toml"
        if candidate.is_file() and _has_syncpass_table(candidate):
            return candidate
    return None


def _has_syncpass_table(path: Path) -> bool:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    if "syncpass" not in text:  # most pyproject.toml files: no need to parse them
        return False
    table, _, name = read_config_table(path)
    return name == "tool.syncpass" and _declares_table(table, text)


def _declares_table(table: Mapping[str, Any], text: str) -> bool:
    """An empty ``[tool.syncpass]`` counts: it marks the project root on purpose."""
    return bool(table) or re.search(r"^\s*\[\s*tool\s*\.\s*syncpass\s*\]", text, re.M) is not None


def load_project_config(path: Path) -> ProjectConfig:
    """Read and check a config file: a ``pyproject.toml`` or a TOML file of its own.

    Raises :class:`SyncpassError` naming the file, the line where it can be
    found, and the table, for unknown keys and bad values.
    """
    table, text, name = read_config_table(path)
    where = _Locator(path, text, name)
    valid = (*CONFIG_KEYS, *PROJECT_KEYS)
    _reject_unknown(table, valid, where, where.table_name(), None)
    sync = default_sync_config()
    sync_keys = tuple(key for key in CONFIG_KEYS if key in table)
    for key in sync_keys:
        sync = sync_config_from_mapping({key: table[key]}, where.line(None, key), sync)
    backend = table.get("backend", DEFAULT_BACKEND)
    if backend not in backend_names():
        raise SyncpassError(
            f"backend must be one of {', '.join(backend_names())}, got {backend!r}",
            where.line(None, "backend"),
        )
    stages = _read_stages(table, None, where)
    hardware = _read_hardware(table.get("hardware"), where)
    models = _read_models(table.get("models", []), where)
    schedule = table.get("schedule")
    if schedule is not None and schedule not in SCHEDULES:
        raise SyncpassError(
            f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}",
            where.line(None, "schedule"),
        )
    per_device = table.get("stages_per_device")
    if per_device is not None:
        try:
            _check_stages(per_device, "stages_per_device")
        except ValueError as error:
            raise SyncpassError(str(error), where.line(None, "stages_per_device")) from None
    return ProjectConfig(
        path=path,
        sync=sync,
        sync_keys=sync_keys,
        backend=backend,
        stages=stages,
        hardware=hardware,
        models=models,
        schedule=schedule,
        stages_per_device=per_device,
        stages_per_device_at=where.line(None, "stages_per_device"),
    )


def _reject_unknown(
    table: Mapping[str, Any],
    valid: tuple[str, ...],
    where: _Locator,
    name: str,
    entry: int | None,
) -> None:
    unknown = [key for key in table if key not in valid]
    if unknown:
        raise SyncpassError(
            f"unknown setting {', '.join(map(repr, unknown))} in {name}; valid settings are "
            f"{', '.join(valid)}",
            where.line(entry, unknown[0]),
        )


def _read_stages(table: Mapping[str, Any], entry: int | None, where: _Locator) -> Stages | None:
    stages = table.get("stages")
    if stages is None:
        return None
    try:
        _check_stages(stages)
    except ValueError as error:
        raise SyncpassError(str(error), where.line(entry, "stages")) from None
    assert isinstance(stages, (int, str))
    return stages


def _read_hardware(value: Any, where: _Locator) -> str | None:
    """A shipped profile's name, or a ``.toml`` file relative to the config file."""
    if value is None:
        return None
    location = where.line(None, "hardware")
    if not isinstance(value, str) or not value:
        raise SyncpassError(
            f"hardware must be a profile name or a .toml file, got {value!r}", location
        )
    if value.endswith(".toml") or "/" in value:
        path = _inside_project(value, where, "hardware", None, "hardware")
        if not path.is_file():
            raise SyncpassError(f"no hardware profile file {path}", location)
        return str(path)
    if value not in profile_names():
        raise SyncpassError(
            f"no hardware profile named {value!r}; shipped profiles: "
            f"{', '.join(profile_names())} (or give a .toml file)",
            location,
        )
    return value


def _read_models(value: Any, where: _Locator) -> tuple[ModelEntry, ...]:
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        raise SyncpassError(
            f"models must be an array of tables ([[{where.prefix}models]]), got {value!r}",
            where.line(None, "models"),
        )
    entries = []
    for index, item in enumerate(value):
        name = f"[[{where.prefix}models]] entry {index + 1}"
        header = where.line(index, None)
        _reject_unknown(item, MODEL_KEYS, where, name, index)
        missing = [key for key in _REQUIRED_MODEL_KEYS if key not in item]
        if missing:
            raise SyncpassError(
                f"{name} needs {', '.join(missing)} (the keys are {', '.join(MODEL_KEYS)})",
                header,
            )
        paths = []
        for key in _REQUIRED_MODEL_KEYS:
            if not isinstance(item[key], str) or not item[key]:
                raise SyncpassError(
                    f"{key} in {name} must be a path, got {item[key]!r}", where.line(index, key)
                )
            paths.append(_inside_project(item[key], where, f"{key} in {name}", index, key))
        model = item.get("model")
        if model is not None and (not isinstance(model, str) or not model.isidentifier()):
            raise SyncpassError(
                f"model in {name} must be a class name, got {model!r}", where.line(index, "model")
            )
        try:
            entries.append(
                ModelEntry(
                    source=paths[0],
                    generated=paths[1],
                    costs=paths[2],
                    stages=_read_stages(item, index, where),
                    model=model,
                    location=header,
                )
            )
        except ValueError as error:
            raise SyncpassError(f"{name}: {error}", header) from None
    return tuple(entries)


def _project_root(config: Path) -> Path:
    """The project a config file belongs to, symlinks resolved: a ``pyproject.toml``'s own
    folder; for a TOML file of its own (``--config ci/sync.toml``), the nearest folder at or
    above it that holds a ``pyproject.toml`` or ``.git``, else its own folder."""
    folder = config.resolve().parent
    if config.name == "pyproject.toml":
        return folder
    for candidate in (folder, *folder.parents):
        if (candidate / "pyproject.toml").is_file() or (candidate / ".git").exists():
            return candidate
    return folder


def _inside_project(value: str, where: _Locator, name: str, entry: int | None, key: str) -> Path:
    """``value``, relative to the config file's folder, when it resolves inside the project
    (:func:`_project_root`); else an error naming the key: a config file may make syncpass read and write its project's files only
    (``check --fix`` writes ``generated``), never ``/etc/...`` or ``../..`` outside it,
    symlinks followed."""
    root = where.root
    path = where.folder / value
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError) as error:  # a symlink loop
        raise SyncpassError(
            f"{name}: cannot resolve {value!r}: {error}", where.line(entry, key)
        ) from None
    if not resolved.is_relative_to(root):
        raise SyncpassError(
            f"{name} must name a file inside the project ({root}), got {value!r}, which "
            f"resolves to {resolved}; syncpass reads and writes only the project's own files",
            where.line(entry, key),
        )
    return path


def _relative(path: Path) -> Path:
    """``path`` relative to the working folder when inside it (for messages)."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path


_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?")


class _Locator:
    """Where a key of the config stands in its file: ``path:line``, for messages.

    tomllib keeps no positions, so lines are found by scanning the text for
    table headers and ``key =`` lines; where that fails, the file alone is named.
    """

    def __init__(self, path: Path, text: str, table: str) -> None:
        self.path = _relative(path)
        self.folder = path.parent
        self.root = _project_root(path)
        self.lines = text.splitlines()
        self.table = table  # "tool.syncpass", or "" for a file of its own
        self.prefix = f"{table}." if table else ""

    def table_name(self) -> str:
        return f"[{self.table}]" if self.table else f"the top level of {self.path.name}"

    def line(self, entry: int | None, key: str | None) -> str:
        """``path:line`` of ``key`` in the table (in entry ``entry`` of the models array)."""
        header = self._header_of(entry)
        found = self._find(header, entry, key)
        return f"{self.path}:{found}" if found else str(self.path)

    def _header_of(self, entry: int | None) -> str:
        return f"{self.prefix}models" if entry is not None else self.table

    def _find(self, header: str, entry: int | None, key: str | None) -> int | None:
        current = ""
        seen = -1
        for number, text in enumerate(self.lines, start=1):
            found = _HEADER.match(text)
            if found:
                current = re.sub(r"[\s\"']", "", found.group(2))
                if current == header and found.group(1) == "[[":
                    seen += 1
                if current == header and key is None and (entry is None or seen == entry):
                    return number
                continue
            if key is None or current != header or (entry is not None and seen != entry):
                continue
            if re.match(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=", text):
                return number
        if key is not None and entry is not None:  # models = [{...}] inline: the array's line
            return self._find(self.table, None, "models")
        return None

"""``syncpass check``: generated pipeline sources are current, and forwards do not stall.

For each ``[[tool.syncpass.models]]`` entry of the project configuration
(:mod:`syncpass.settings.project`), the generated file must be exactly what
``syncpass rewrite SOURCE --costs COSTS --stages STAGES`` writes now, with the
project's settings; and the model sources' ``forward`` methods are linted for
implicit host-device synchronisation (the backend's ``lint`` hook; torch's is
:mod:`syncpass.backends.torch.lint`). This is what the
``syncpass-check`` pre-commit hook runs, on the files a commit changes.

Nothing here imports torch, jax or the user's code: the sources are parsed,
the plans come from the committed cost files.

Exit status: 0 all current and clean; 1 a generated file is stale or missing,
or the lint found something; 2 an error (bad config, unreadable source, bad
cost file), each named with its file and line.
"""

from __future__ import annotations

import argparse
import difflib
import shlex
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from syncpass.backends.registry import load_backend
from syncpass.commands.cliargs import EXIT_ERROR, EXIT_FOUND, EXIT_OK, positive_int, threshold
from syncpass.contracts.config import strategy_names
from syncpass.core.errors import SyncpassError, unexpected_error
from syncpass.core.fileio import write_atomically
from syncpass.core.samecode import same_code
from syncpass.settings.project import (
    ModelEntry,
    ProjectConfig,
    find_project_config,
    load_project_config,
)

if TYPE_CHECKING:
    from syncpass.backends.spec import Lint
    from syncpass.frontend.findings import Finding
    from syncpass.rewrite.driver import RewriteResult


@dataclass(frozen=True)
class CheckRequest:
    """What to check.

    ``files``: the files a commit changes (empty: every model entry of the
    configuration found from ``start``); ``config``: a config file to use
    instead of discovery; ``sync``: settings given as flags, over the files'.
    """

    files: tuple[Path, ...] = ()
    config: Path | None = None
    fix: bool = False
    lint: bool = True
    sync: tuple[tuple[str, Any], ...] = ()
    start: Path = Path()


@dataclass(frozen=True)
class EntryOutcome:
    """One model entry: ``state`` is ``current``, ``stale``, ``missing`` or ``fixed``."""

    entry: ModelEntry
    state: str
    command: str  # the rewrite command the generated file must equal the output of
    summary: str  # the plan, in one line
    diff: str = ""  # generated file -> what rewrite writes now

    def __post_init__(self) -> None:
        if self.state not in ("current", "stale", "missing", "fixed"):
            raise ValueError(f"unknown state {self.state!r}")

    @property
    def failed(self) -> bool:
        return self.state in ("stale", "missing")


@dataclass(frozen=True)
class CheckResult:
    """Everything a check found; the library never raises for bad input, it lists it here."""

    outcomes: tuple[EntryOutcome, ...]
    findings: tuple[Finding, ...]
    errors: tuple[SyncpassError, ...]
    linted: tuple[Path, ...]

    @property
    def exit_status(self) -> int:
        if self.errors:
            return EXIT_ERROR
        if self.findings or any(outcome.failed for outcome in self.outcomes):
            return EXIT_FOUND
        return EXIT_OK


@dataclass(frozen=True)
class _Work:
    """The entries of one configuration to check, and the files to lint."""

    project: ProjectConfig
    entries: tuple[ModelEntry, ...]
    lint: tuple[Path, ...]


def run_check(request: CheckRequest) -> CheckResult:
    """Check the model entries and lint the files ``request`` selects; writes only with ``fix``."""
    errors: list[SyncpassError] = []
    outcomes: list[EntryOutcome] = []
    findings: list[Finding] = []
    linted: list[Path] = []
    work = _select(request, errors)
    seen: set[Path] = set()
    for item in work:
        for entry in item.entries:
            try:
                outcomes.append(_check_entry(item.project, entry, request))
            except SyncpassError as error:
                errors.append(error)
            except Exception as error:  # a crash on one entry is its error; go on
                errors.append(unexpected_error(error, shown(entry.source)))
        lint = load_backend(item.project.backend).lint if request.lint else None
        if lint is None:  # --no-lint, or a backend without a lint
            continue
        for path in item.lint:
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            try:
                findings.extend(_lint_file(path, lint))
                linted.append(path)
            except SyncpassError as error:
                errors.append(error)
            except Exception as error:  # a crash on one file is its error; go on
                errors.append(unexpected_error(error, shown(path)))
    return CheckResult(tuple(outcomes), tuple(findings), tuple(errors), tuple(linted))


# --- what to check -------------------------------------------------------------------


def _select(request: CheckRequest, errors: list[SyncpassError]) -> list[_Work]:
    if not request.files:
        return _select_all(request, errors)
    groups: dict[Path | None, list[Path]] = {}
    found: dict[Path, Path | None] = {}  # folder -> its config, found once per folder
    for path in request.files:
        if not path.exists():
            errors.append(SyncpassError("no such file", shown(path)))
            continue
        if request.config is not None:
            config: Path | None = request.config
        else:
            folder = path.resolve().parent
            if folder not in found:
                try:
                    found[folder] = find_project_config(folder)
                except SyncpassError as error:
                    errors.append(error)
                    found[folder] = None
            config = found[folder]
        groups.setdefault(config, []).append(path)
    work = []
    for config, paths in groups.items():
        if config is None:  # no configuration above these files: lint them only
            work.append(_Work(ProjectConfig(), (), tuple(p for p in paths if p.suffix == ".py")))
            continue
        try:
            project = load_project_config(config)
        except SyncpassError as error:
            errors.append(error)
            continue
        work.append(_select_entries(project, config, paths))
    return work


def _select_all(request: CheckRequest, errors: list[SyncpassError]) -> list[_Work]:
    try:
        config = request.config or find_project_config(request.start)
        if config is None:
            raise SyncpassError(
                f"no configuration: no pyproject.toml with a [tool.syncpass] table in "
                f"{request.start.resolve()} or above; give --config FILE, or the files to check"
            )
        project = load_project_config(config)
    except SyncpassError as error:
        errors.append(error)
        return []
    if not project.models:
        errors.append(
            SyncpassError(
                "no [[tool.syncpass.models]] entries: nothing to check (each entry names a "
                "source, its generated file and its cost file)",
                str(config),
            )
        )
    return [_Work(project, project.models, tuple(entry.source for entry in project.models))]


def _select_entries(project: ProjectConfig, config: Path, paths: list[Path]) -> _Work:
    """The entries whose files are among ``paths`` (all of them when the config changed)."""
    changed = {path.resolve() for path in paths}
    if config.resolve() in changed:
        entries = project.models
    else:
        entries = tuple(
            entry
            for entry in project.models
            if any(file.resolve() in changed for file in entry.files)
        )
    generated = {entry.generated.resolve() for entry in project.models}
    lint = [path for path in paths if path.suffix == ".py" and path.resolve() not in generated]
    lint.extend(entry.source for entry in entries)
    return _Work(project, entries, tuple(lint))


# --- one model entry ----------------------------------------------------------------------


def rewrite_entry(
    project: ProjectConfig, entry: ModelEntry, sync: Iterable[tuple[str, Any]] = ()
) -> RewriteResult:
    """What ``syncpass rewrite`` writes for ``entry`` now, with the project's settings.

    The same steps as the ``rewrite`` command, through the same resolver
    (:func:`syncpass.settings.resolve.resolve_settings`): read the source and
    the cost file, re-target the costs to the configured hardware, lay the
    settings over the cost file's (config file, then ``sync`` flags) and rewrite.
    """
    from syncpass.backends.registry import load_backend
    from syncpass.contracts.costs import load_costs
    from syncpass.frontend.source import read_model_text
    from syncpass.rewrite.driver import rewrite_text
    from syncpass.settings.resolve import Overrides, resolve_settings

    flags = dict(sync)
    settings = resolve_settings(
        entry.source,
        Overrides(
            strategy=flags.get("strategy"),
            min_sync_interval=flags.get("min_sync_interval"),
            communication_cost_threshold=flags.get("communication_cost_threshold"),
        ),
        project=project,
    )
    text = read_model_text(entry.source)
    costs = settings.retarget(load_costs(entry.costs))
    request = settings.request(costs)
    if settings.stages is None and request.config.strategy != "manual":
        raise SyncpassError(
            "no stage count for this model: set stages in its [[tool.syncpass.models]] entry "
            "or in [tool.syncpass]",
            entry.location,
        )
    return rewrite_text(
        text,
        shown(entry.source),
        load_backend(settings.backend),
        request,
        costs,
        class_name=settings.model,
        max_stages=settings.auto_limit,
    )


def _check_entry(project: ProjectConfig, entry: ModelEntry, request: CheckRequest) -> EntryOutcome:
    from syncpass.core.units import seconds

    result = rewrite_entry(project, entry, request.sync)
    plan = result.plan
    summary = (
        f"{len(plan.sync_points)} sync point(s), {len(plan.stages)} stage(s): bottleneck "
        f"{seconds(plan.bottleneck_s)}, predicted step {seconds(plan.predicted_step_s)}"
    )
    current = _read_generated(entry.generated)
    if current is not None and same_code(current, result.rewritten):  # reformatted is current
        return EntryOutcome(entry, "current", "", summary)
    command = _rewrite_command(project, entry, request.sync)
    name = shown(entry.generated)
    diff = "".join(
        difflib.unified_diff(
            (current or "").splitlines(keepends=True),
            result.rewritten.splitlines(keepends=True),
            fromfile="/dev/null" if current is None else name,
            tofile=name,
        )
    )
    if request.fix:
        write_atomically(entry.generated, result.rewritten)
        return EntryOutcome(entry, "fixed", command, summary, diff)
    return EntryOutcome(entry, "missing" if current is None else "stale", command, summary, diff)


def _read_generated(path: Path) -> str | None:
    """The generated file's text; ``None`` when it does not exist yet."""
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise SyncpassError("is a folder, not a generated source file", shown(path)) from None
    except OSError as error:
        raise SyncpassError(f"cannot read the file: {error.strerror}", shown(path)) from None
    except UnicodeDecodeError:
        return ""  # not text: stale, whatever it holds


def _rewrite_command(
    project: ProjectConfig, entry: ModelEntry, sync: Iterable[tuple[str, Any]]
) -> str:
    """The ``syncpass rewrite`` command line that writes ``entry``'s generated file."""
    words = ["syncpass", "rewrite", shown(entry.source), "--costs", shown(entry.costs)]
    stages = project.stages_for(entry)
    if stages is not None:
        words += ["--stages", str(stages)]
    if entry.model is not None:
        words += ["--model", entry.model]
    if project.path is not None and find_project_config(entry.source) != project.path.resolve():
        words += ["--config", shown(project.path)]  # rewrite would not find it by itself
    for key, value in sync:
        words += [_FLAGS[key], str(value)]
    words += ["-o", shown(entry.generated)]
    return shlex.join(words)


_FLAGS = {
    "strategy": "--strategy",
    "min_sync_interval": "--min-sync-interval",
    "communication_cost_threshold": "--threshold",
}


def _lint_file(path: Path, lint: Lint) -> tuple[Finding, ...]:
    from syncpass.frontend.source import decode_source

    try:
        data = path.read_bytes()
    except OSError as error:
        raise SyncpassError(f"cannot read the file: {error.strerror}", shown(path)) from None
    if not data.strip():
        return ()  # an empty __init__.py: nothing to lint
    return tuple(lint(decode_source(data, shown(path)), shown(path)))


def shown(path: Path) -> str:
    """``path`` as a user reads it: relative to the working folder when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# --- the command line ---------------------------------------------------------------------


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``check`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``); its parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "check",
        help="check that generated pipeline sources are current, and lint model forwards",
        description="For each [[tool.syncpass.models]] entry, check that its generated file is "
        "what `syncpass rewrite` writes now from its source and cost file, and lint the model "
        "sources' forward methods for host-device synchronisation (rules SP101-SP107, "
        "suppressed per line with # noqa: CODE). With FILES (as pre-commit passes them), only "
        "the entries those files belong to are checked, and the Python files among them are "
        "linted. Diffs and findings go to stdout, messages to stderr. Exit 0 clean, 1 stale "
        "or findings, 2 error. Never imports torch or the model's code.",
    )
    parser.add_argument(
        "files", nargs="*", type=Path, metavar="FILE", help="changed files (default: all models)"
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML settings ([tool.syncpass] or top level); default: the nearest pyproject.toml "
        "with [tool.syncpass]",
    )
    parser.add_argument(
        "--fix", action="store_true", help="rewrite stale or missing generated files"
    )
    parser.add_argument("--no-lint", action="store_true", help="check generated files only")
    parser.add_argument("--strategy", choices=strategy_names(), help="over the configuration's")
    parser.add_argument(
        "--min-sync-interval", type=positive_int, metavar="K", help="over the configuration's"
    )
    parser.add_argument(
        "--threshold", type=threshold, metavar="TAU", help="over the configuration's"
    )
    parser.set_defaults(handler=check_command)
    return parser


def check_command(args: argparse.Namespace) -> int:
    """Run ``syncpass check``; print what it found; its exit status."""
    flags = {
        "strategy": args.strategy,
        "min_sync_interval": args.min_sync_interval,
        "communication_cost_threshold": args.threshold,
    }
    request = CheckRequest(
        files=tuple(args.files),
        config=args.config,
        fix=args.fix,
        lint=not args.no_lint,
        sync=tuple((key, value) for key, value in flags.items() if value is not None),
    )
    result = run_check(request)
    report_check(result)
    return result.exit_status


def report_check(result: CheckResult, out: Any = None, err: Any = None) -> None:
    """Diffs and findings to ``out`` (stdout), messages and errors to ``err`` (stderr)."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    for outcome in result.outcomes:
        name = shown(outcome.entry.generated)
        if outcome.state == "fixed":
            print(f"syncpass: fixed {name}: {outcome.summary}", file=err)
        elif outcome.failed:
            what = "missing" if outcome.state == "missing" else "stale"
            out.write(
                f"{name}: {what}: it must be what `{outcome.command}` writes now; "
                "run `syncpass check --fix` to rewrite it\n"
            )
            out.write(outcome.diff)
    for finding in sorted(result.findings, key=lambda f: (f.path, f.line, f.column)):
        out.write(f"{finding}\n")
    for error in result.errors:
        print(f"syncpass: error: {error}", file=err)
    print(f"syncpass check: {_summary(result)}", file=err)


def _summary(result: CheckResult) -> str:
    parts = []
    if result.outcomes:
        counts = {
            state: sum(outcome.state == state for outcome in result.outcomes)
            for state in ("stale", "missing", "fixed")
        }
        detail = ", ".join(f"{count} {state}" for state, count in counts.items() if count)
        parts.append(
            f"{len(result.outcomes)} generated file(s) checked"
            + (f" ({detail})" if detail else ", all current")
        )
    if result.linted:
        parts.append(f"{len(result.findings)} finding(s) in {len(result.linted)} linted file(s)")
    if result.errors:
        parts.append(f"{len(result.errors)} error(s)")
    return "; ".join(parts) if parts else "nothing to check"

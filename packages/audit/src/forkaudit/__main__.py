"""The `forkaudit` command: `diff` and `find-base`.

Exit codes: 0 when the command ran, whatever it found; 1 with `--fail-on-surprise` when the
verdict finds a surprise patch, or with `--fail-on-hooks` when a plugin hook changed or is
missing; 2 for bad input, with a one-line error on stderr.
"""

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from forkaudit._audit import diff
from forkaudit._errors import AuditError
from forkaudit._findbase import find_base

EXIT_OK = 0
EXIT_SURPRISE = 1
#: The hooks gate fails as the surprise gate does: the command ran and found what it gates on.
EXIT_HOOKS = EXIT_SURPRISE
EXIT_BAD_INPUT = 2


class _UsageError(Exception):
    """Raised instead of argparse's exit, so that every error stays one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


class _CliArgs(argparse.Namespace):
    command: str
    fork: str | None
    upstream: str | None
    upstream_repo: Path
    candidates: str
    rules: Path | None
    scope: str | None
    base: str | None
    cache_dir: Path | None
    json: str | None
    markdown: str | None
    markdown_lang: str
    patch: str | None
    fail_on_surprise: bool
    hooks: Path | None
    hooks_version: str | None
    fail_on_hooks: bool


def _parser() -> _Parser:
    parser = _Parser(prog="forkaudit", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    spec_help = (
        "git:PATH@REV, sdist:FILE.tar.gz, pypi:NAME==VERSION, wheel:FILE.whl, "
        "pypi-wheel:NAME==VERSION, installed:DIST or dir:PATH"
    )

    audit = commands.add_parser("diff", help="diff a fork against an upstream and judge it")
    pinned = "default: the rules' [{}] source"
    audit.add_argument(
        "--fork", help=f"PATH[@REV] or a SPEC ({spec_help}; {pinned.format('fork')})"
    )
    audit.add_argument("--upstream", help=f"SPEC ({spec_help}; {pinned.format('upstream')})")
    audit.add_argument("--base", help="SPEC of the true upstream base, for attribution")
    audit.add_argument("--rules", type=Path, help="rules file (default: the shipped vLLM rules)")
    audit.add_argument("--json", metavar="OUT", help="write the JSON document ('-': stdout)")
    audit.add_argument("--markdown", metavar="OUT", help="write the Markdown report")
    audit.add_argument("--markdown-lang", choices=["en", "zh"], default="en")
    audit.add_argument("--patch", metavar="OUT", help="write the full unified patch")
    audit.add_argument("--fail-on-surprise", action="store_true", help="exit 1 on a surprise")
    audit.add_argument(
        "--hooks", type=Path, metavar="FILE", help="check the plugin hooks this file declares"
    )
    audit.add_argument(
        "--hooks-version",
        metavar="RELEASE",
        help="the release whose hooks apply (default: the one the fork's source reports)",
    )
    audit.add_argument(
        "--fail-on-hooks", action="store_true", help="exit 1 when a hook changed or is missing"
    )

    base = commands.add_parser("find-base", help="rank upstream commits by distance to the fork")
    base.add_argument("--fork", required=True, help="PATH[@REV] or a SPEC")
    base.add_argument("--upstream-repo", required=True, type=Path, metavar="PATH")
    base.add_argument("--candidates", required=True, metavar="REVSPEC", help="A..B or tags")
    base.add_argument("--json", metavar="OUT", help="write the JSON document ('-': stdout)")

    for command in (audit, base):
        command.add_argument("--scope", metavar="PREFIX", help="compare only this subtree")
        command.add_argument("--cache-dir", type=Path, help="where downloads are kept")
    return parser


def main(argv: Sequence[str]) -> int:
    """Run the command line ARGV (without the program name); return the exit code."""
    try:
        args = _parser().parse_args(argv, namespace=_CliArgs())
        if args.command == "diff":
            return _run_diff(args)
        return _run_find_base(args)
    except _UsageError as error:
        _print_error(f"{error} (see forkaudit --help)")
    except AuditError as error:
        _print_error(str(error))
    return EXIT_BAD_INPUT


def _print_error(message: str) -> None:
    """One line on stderr, whatever line breaks a message from a library carried."""
    print(f"forkaudit: error: {' '.join(message.split())}", file=sys.stderr)


def _check_outputs(**targets: str | None) -> None:
    """Refuse an output file that cannot be written, before the audit's slow work and before any
    output is written, so that a refused run leaves every file as it was. What only writing can
    tell (a full disk, a file system that refuses new files) `_write_all` still catches."""
    seen: dict[Path, str] = {}
    for option, target in targets.items():
        if target is None or target == "-":
            continue
        path = Path(target).resolve()  # a link is written through: check where it points
        if path.is_dir():
            raise AuditError(f"--{option} {target} is a directory; expected a file path")
        if path.exists() and not path.is_file():
            raise AuditError(f"--{option} {target} is not a regular file (a device or a pipe)")
        if not path.parent.is_dir():
            missing = "is not a directory" if path.parent.exists() else "does not exist"
            raise AuditError(f"--{option} {target}: the directory {path.parent} {missing}")
        if not os.access(path.parent, os.W_OK):
            raise AuditError(f"--{option} {target}: the directory {path.parent} is not writable")
        if path in seen:
            raise AuditError(f"--{seen[path]} and --{option} both name {path}")
        seen[path] = option


def _run_diff(args: _CliArgs) -> int:
    if args.hooks is None and (args.fail_on_hooks or args.hooks_version is not None):
        option = "--fail-on-hooks" if args.fail_on_hooks else "--hooks-version"
        raise _UsageError(f"{option} needs --hooks FILE")
    _check_outputs(json=args.json, markdown=args.markdown, patch=args.patch)
    report = diff(
        args.fork,
        args.upstream,
        rules=args.rules,
        scope=args.scope,
        base=args.base,
        cache_dir=args.cache_dir,
        hooks=args.hooks,
        hooks_version=args.hooks_version,
    )
    document = report.to_dict()
    _write_all(
        [
            ("json", args.json, json.dumps(document, indent=2) + "\n"),
            ("markdown", args.markdown, report.to_markdown(args.markdown_lang)),
            ("patch", args.patch, report.patch()),
        ]
    )
    verdict = report.verdict()
    if args.json != "-":
        summary = document["summary"]
        assert isinstance(summary, dict)
        counts = ", ".join(
            f"{k} {summary[k]}"
            for k in ("total", "added", "modified", "deleted", "renamed", "binary")
        )
        print(f"{counts}; left out {summary['left_out']}, ignored {summary['ignored']}")
        print(verdict["summary"])
        if report.hooks is not None:
            print(report.hooks.summary())
    if args.fail_on_surprise and verdict["surprise"]:
        return EXIT_SURPRISE
    if args.fail_on_hooks and report.hooks is not None and report.hooks.to_review():
        return EXIT_HOOKS
    return EXIT_OK


def _run_find_base(args: _CliArgs) -> int:
    _check_outputs(json=args.json)
    assert args.fork is not None  # find-base requires --fork
    result = find_base(
        args.fork, args.upstream_repo, args.candidates, scope=args.scope, cache_dir=args.cache_dir
    )
    _write_all([("json", args.json, json.dumps(result.to_dict(), indent=2) + "\n")])
    if args.json != "-":
        print(f"best: {result.best.commit} ({result.best.files_changed} files changed)")
        for rank, candidate in enumerate(result.ranking, start=1):
            print(f"{rank}. {candidate.commit} {candidate.files_changed}")
    return EXIT_OK


def _write_all(outputs: list[tuple[str, str | None, str]]) -> None:
    """Write each (OPTION, TARGET, TEXT): all files or none, then stdout for a target of "-".

    Each text goes to a temporary file beside its target (through links: where they point);
    only when every one is written are they renamed over their targets. A failure removes the
    temporary files and leaves every target as it was. Odd path bytes survive unchanged.
    """
    files = [
        (option, target, text) for option, target, text in outputs if target not in (None, "-")
    ]
    written: list[tuple[Path, Path]] = []  # (temporary file, target)
    replaced: list[Path] = []
    where = ""
    try:
        for option, target, text in files:
            where = f"--{option} {target}"
            path = Path(str(target)).resolve()
            descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=".forkaudit-")
            written.append((Path(name), path))
            with os.fdopen(descriptor, "w", encoding="utf-8", errors="surrogateescape") as file:
                file.write(text)
                file.flush()
                os.fsync(file.fileno())
            # mkstemp makes the file private; a report is as readable as any file written here.
            mode = path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask()
            Path(name).chmod(mode)
        for temporary, path in written:
            where = str(path)
            temporary.replace(path)
            replaced.append(path)
    except OSError as error:
        for temporary, path in written:
            if path not in replaced:
                with contextlib.suppress(OSError):
                    temporary.unlink()
        # Renames fail only if the file system changes under the run; then say what was kept.
        kept = f"{len(replaced)} of {len(written)} were replaced" if replaced else "none changed"
        msg = f"{where}: cannot be written: {error.strerror}; of the output files, {kept}"
        raise AuditError(msg) from None
    for _option, stdout_target, text in outputs:
        if stdout_target == "-":
            sys.stdout.write(text)


def _umask() -> int:
    """The process's umask (reading it means setting it; it is set straight back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def entrypoint() -> None:
    """The console script: `forkaudit ARGS`."""
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    entrypoint()

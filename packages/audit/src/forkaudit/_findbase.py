"""Finding the upstream commit a fork was really cut from.

Each candidate's distance is the number of paths whose mode or blob id differ from the fork's.
The first candidate's tree is listed once; every later one is reached by applying the diff
from its predecessor, all read from one `git diff-tree --stdin`, so 500 candidates cost about
as much as listing two trees.
"""

import itertools
import os
from dataclasses import dataclass
from pathlib import Path

from forkaudit._errors import ScopeError, SpecError
from forkaudit._git import RepositoryView, run_git
from forkaudit._snapshot import Entry
from forkaudit._sources import list_tree, open_repo, open_spec, resolve_commit

RANKING_SIZE = 5


@dataclass(frozen=True)
class Candidate:
    """One upstream commit and how many paths differ between its tree and the fork's."""

    commit: str
    files_changed: int

    def to_dict(self) -> dict[str, object]:
        return {"commit": self.commit, "files_changed": self.files_changed}


@dataclass(frozen=True)
class BaseSearch:
    """The candidates nearest the fork, nearest first (at most `RANKING_SIZE`), and how many
    were compared; ``to_dict`` is the JSON of `forkaudit find-base`."""

    ranking: list[Candidate]
    candidates: int

    @property
    def best(self) -> Candidate:
        return self.ranking[0]

    def to_dict(self) -> dict[str, object]:
        return {
            "best": self.best.to_dict(),
            "ranking": [c.to_dict() for c in self.ranking],
            "candidates": self.candidates,
        }


def find_base(
    fork: str,
    upstream_repo: Path,
    candidates: str | list[str],
    *,
    scope: str | None = None,
    cache_dir: Path | None = None,
) -> BaseSearch:
    """Rank CANDIDATES (a rev range `A..B` on the first-parent line, or revs) by distance; ties
    go to the earlier candidate."""
    fork_entries = open_spec(fork, scope=scope, cache_dir=cache_dir).entries
    spec = f"--upstream-repo {upstream_repo}"
    view = open_repo(spec, str(upstream_repo))
    git_dir = view.git_dir
    commits = _candidate_commits(spec, view, candidates)
    prefix = os.fsencode(scope or "")

    def differs(path: bytes, entry: Entry | None) -> bool:
        return fork_entries.get(path) != entry

    tree = {p: e for p, e in list_tree(git_dir, commits[0]).items() if p.startswith(prefix)}
    in_scope = bool(fork_entries or tree)
    distance = sum(differs(p, tree.get(p)) for p in fork_entries.keys() | tree.keys())
    ranked = [Candidate(commits[0], distance)]
    steps = "".join(f"{new} {old}\n" for old, new in itertools.pairwise(commits))
    changes_by_commit = _changes_per_step(git_dir, steps.encode()) if steps else {}
    for commit in commits[1:]:
        for path, entry in changes_by_commit.get(commit, []):
            if not path.startswith(prefix):
                continue
            distance += differs(path, entry) - differs(path, tree.get(path))
            if entry is None:
                tree.pop(path, None)
            else:
                tree[path] = entry
        in_scope = in_scope or bool(tree)
        ranked.append(Candidate(commit, distance))
    if scope and not in_scope:
        msg = (
            f"scope {scope!r} matches no file of the fork or of any candidate commit"
            " (a path prefix from the tree root, such as 'vllm/')"
        )
        raise ScopeError(msg)
    ranking = sorted(ranked, key=lambda c: c.files_changed)[:RANKING_SIZE]  # sort is stable
    return BaseSearch(ranking, len(commits))


def _candidate_commits(spec: str, view: RepositoryView, candidates: str | list[str]) -> list[str]:
    """Full commit ids of the candidates; a range `A..B` means A and B's first-parent line."""
    if isinstance(candidates, str) and ".." in candidates:
        lower_rev, upper_rev = (rev.strip() for rev in candidates.split("..", 1))
        lower, upper = (resolve_commit(spec, view, rev) for rev in (lower_rev, upper_rev))
        line = run_git(
            view.git_dir, ["rev-list", "--first-parent", "--reverse", f"{lower}..{upper}"]
        ).split()
        if not line:  # B is A, or B is an ancestor of A: the range is empty, not "just A"
            msg = f"`{spec}`: candidate range {candidates!r} is empty: " + (
                f"both ends name commit {lower[:12]}"
                if lower == upper
                else f"{upper_rev!r} is an ancestor of {lower_rev!r}, so the range is reversed "
                f"(did you mean '{upper_rev}..{lower_rev}'?)"
            )
            raise SpecError(msg)
        commits = [lower, *(commit.decode() for commit in line)]
    else:
        names = candidates.replace(",", " ").split() if isinstance(candidates, str) else candidates
        commits = [resolve_commit(spec, view, name) for name in names]
    if not commits:
        msg = f"{spec}: no candidate commits in {candidates!r}"
        raise SpecError(msg)
    return list(dict.fromkeys(commits))


def _changes_per_step(git_dir: Path, steps: bytes) -> dict[str, list[tuple[bytes, Entry | None]]]:
    """For each `NEW OLD` line, the paths that change from OLD to NEW (None: deleted)."""
    out = run_git(
        git_dir, ["diff-tree", "--stdin", "--always", "-r", "-z", "--no-renames"], stdin=steps
    )
    changes: dict[str, list[tuple[bytes, Entry | None]]] = {}
    current: list[tuple[bytes, Entry | None]] = []
    fields = iter(out.split(b"\0"))
    for field in fields:
        if not field:
            continue
        if not field.startswith(b":"):  # the header naming the commit whose diff follows
            current = changes.setdefault(field.decode().strip(), [])
            continue
        _old_mode, new_mode, _old_oid, new_oid, status = field[1:].decode().split(" ")
        path = next(fields)
        current.append((path, None if status == "D" else Entry(new_mode, new_oid)))
    return changes

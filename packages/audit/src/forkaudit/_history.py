"""What the fork's git history says about how it was published.

A vendor that publishes one grafted (or shallow) commit hides where it branched from; a
message naming two features on a commit that differs from upstream in 189 files hides the rest.
"""

import re

from forkaudit._git import run_git
from forkaudit._snapshot import Snapshot

# Separators between topics in a subject such as "[Arch] Support bmz and nmz".
_TOPIC_SEPARATORS = re.compile(r",|;|&|\+|\band\b|\bplus\b", re.IGNORECASE)
_TAG_PREFIX = re.compile(r"^(\s*\[[^\]]*\])+")


def inspect_history(fork: Snapshot, files_changed: int, files_per_topic: int) -> dict[str, object]:
    """History facts of a git fork; for other kinds only `kind` and `available: false`."""
    if fork.git_dir is None or fork.commit is None:
        return {"kind": fork.kind, "available": False}
    git_dir = fork.git_dir
    shallow_file = git_dir / "shallow"
    shallow_commits = set(shallow_file.read_text().split()) if shallow_file.is_file() else set()
    count = int(run_git(git_dir, ["rev-list", "--count", fork.commit]).decode())
    roots = run_git(git_dir, ["rev-list", "--max-parents=0", fork.commit]).decode().split()
    # Author, committer date and message, NUL-separated; git runs no mailmap or signature check.
    show = ["show", "--no-patch", "--format=%an%x00%ae%x00%cI%x00%B", fork.commit]
    shown = run_git(git_dir, show)
    author, email, date, message = shown.decode("utf-8", "replace").split("\0", 3)
    subject = message.strip().splitlines()[0] if message.strip() else ""
    topics = _count_topics(subject)
    fits = files_changed <= topics * files_per_topic
    return {
        "kind": fork.kind,
        "available": True,
        "commit": fork.commit,
        "subject": subject,
        "author": f"{author} <{email}>",
        "date": date,
        "grafted": fork.commit in shallow_commits or (git_dir / "info" / "grafts").is_file(),
        "shallow": bool(shallow_commits),
        "root_commits": len(roots),
        "single_root_commit": count == 1,
        "commit_count": count,
        "message_topics": topics,
        "message_fits": fits,
        "message_reason": (
            f"the message names {topics} topic(s); the commit differs from upstream in "
            f"{files_changed} files (plausible: up to {topics * files_per_topic})"
        ),
    }


def _count_topics(subject: str) -> int:
    """How many things a subject names: "[Arch] Support bmz and nmz" names two."""
    body = _TAG_PREFIX.sub("", subject)
    return max(1, sum(1 for part in _TOPIC_SEPARATORS.split(body) if part.strip()))

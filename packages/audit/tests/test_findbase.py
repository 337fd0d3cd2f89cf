"""`find_base` on a fork cut from c4, squashed into one orphan commit."""

import pytest

import forkaudit

from conftest import Repos


def test_range_ranks_the_true_base_first(repos: Repos) -> None:
    result = forkaudit.find_base(str(repos.fork2), repos.upstream, "v0.1.1..v0.2.0")
    c = repos.commits
    assert result.candidates == 4  # v0.1.1 (c3) and the first-parent line c4..c6
    assert result.best == forkaudit.Candidate(c["c4"], 2)
    # c3 lacks c4's block_pool change; c5 adds the worker and docs changes; ties keep order.
    assert result.to_dict()["ranking"] == [
        {"commit": c["c4"], "files_changed": 2},
        {"commit": c["c3"], "files_changed": 3},
        {"commit": c["c5"], "files_changed": 3},
        {"commit": c["c6"], "files_changed": 5},
    ]


def test_tag_list_and_scope(repos: Repos) -> None:
    result = forkaudit.find_base(str(repos.fork2), repos.upstream, "v0.1.0, v0.1.1 v0.2.0")
    c = repos.commits
    assert result.to_dict()["ranking"] == [
        {"commit": c["c3"], "files_changed": 3},
        {"commit": c["c1"], "files_changed": 5},
        {"commit": c["c6"], "files_changed": 5},
    ]
    scoped = forkaudit.find_base(
        str(repos.fork2), repos.upstream, ["v0.1.0", "v0.1.1"], scope="vllm/platforms/"
    )
    assert scoped.best == forkaudit.Candidate(c["c1"], 1)


@pytest.mark.parametrize(
    ("candidates", "message"),
    [
        (
            "v0.2.0..v0.1.1",
            r"candidate range 'v0.2.0..v0.1.1' is empty: 'v0.1.1' is an ancestor of 'v0.2.0', "
            r"so the range is reversed \(did you mean 'v0.1.1..v0.2.0'\?\)",
        ),
        ("v0.1.1..v0.1.1", r"candidate range 'v0.1.1..v0.1.1' is empty: both ends name commit"),
    ],
)
def test_empty_range_is_an_error_not_one_candidate(
    repos: Repos, candidates: str, message: str
) -> None:
    with pytest.raises(forkaudit.SpecError, match=message):
        forkaudit.find_base(str(repos.fork2), repos.upstream, candidates)


def test_scope_matching_nothing_is_an_error(repos: Repos) -> None:
    with pytest.raises(forkaudit.ScopeError, match=r"^scope 'zz/' matches no file of the fork"):
        forkaudit.find_base(str(repos.fork2), repos.upstream, "v0.1.1..v0.2.0", scope="zz/")


def test_scope_matching_only_a_later_candidate_still_ranks(repos: Repos) -> None:
    # Neither the fork nor v0.1.1 has vllm/new_feature.py; only c6 adds it.
    result = forkaudit.find_base(
        str(repos.fork2), repos.upstream, "v0.1.1..v0.2.0", scope="vllm/new_feature"
    )
    c = repos.commits
    assert result.to_dict()["ranking"] == [
        {"commit": c["c3"], "files_changed": 0},
        {"commit": c["c4"], "files_changed": 0},
        {"commit": c["c5"], "files_changed": 0},
        {"commit": c["c6"], "files_changed": 1},
    ]

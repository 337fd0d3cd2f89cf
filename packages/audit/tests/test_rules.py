"""The rules file: strict parsing, first-match classification, every file somewhere."""

import pytest

import forkaudit
from forkaudit._rules import parse_rules

MINIMAL = """
title = "t"
keywords = ["int8"]
ignore = ["**/*.lock"]

[[group]]
title = "KV cache"
area = "kv_cache"
streams = ["A", "B"]
risk = true
globs = ["vllm/**/*kv_cache*"]
ignore = ["vllm/**/testdata/**"]

  [[group.sub]]
  title = "Block management"
  streams = ["A"]
  globs = ["vllm/core/**"]

[[group]]
title = "Tests"
area = "tests"
globs = ["tests/**", "vllm/**/testdata/**"]
"""


def test_deepest_group_of_first_match_claims_and_labels_list_all() -> None:
    rules = parse_rules(MINIMAL, "minimal")
    block = rules.classify("vllm/core/kv_cache_manager.py")
    assert block.group is not None and block.group.title_path() == "KV cache / Block management"
    assert (block.area, block.streams, block.risk) == ("kv_cache", ("A",), True)
    test = rules.classify("tests/test_kv_cache.py")
    assert (test.area, test.labels) == ("tests", ("tests",))
    other = rules.classify("setup.py")
    assert (other.area, other.streams, other.risk, other.group) == ("other", (), False, None)
    assert rules.classify("uv.lock").ignored_by == "**/*.lock"
    # A group's own ignore keeps the file grouped but out of the counts.
    grouped = rules.classify("vllm/x/testdata/kv_cache.bin")
    assert (grouped.area, grouped.ignored_by) == ("kv_cache", "vllm/**/testdata/**")
    assert grouped.labels == ("kv_cache", "tests")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (MINIMAL.replace('title = "t"', 'titel = "t"'), "unknown key `titel`"),
        (MINIMAL.replace('  streams = ["A"]', '  stream = ["A"]'), "unknown key `stream`"),
        (
            MINIMAL.replace('streams = ["A", "B"]', 'streams = ["D"]'),
            "`streams` must only hold A, B, C",
        ),
        (MINIMAL.replace('area = "tests"\n', ""), "`area` is required"),
        (MINIMAL.replace("risk = true", 'risk = "yes"'), "`risk` must be a bool"),
        ("title = 1\n", "`title` must be a str"),
        (MINIMAL + '[fork]\nurl = "https://x"\n', "minimal [fork]: unknown key `url`"),
        (MINIMAL + "[upstream]\nsource = 3\n", "minimal [upstream]: `source` must be a str"),
        ("[[group]\n", "minimal"),
        *(
            (
                MINIMAL + f"\n[history]\nfiles_per_topic = {value}\n",
                f"minimal [history]: `files_per_topic` must be a positive integer, got {shown}",
            )
            for value, shown in (("-3", "-3"), ("0", "0"), ("true", "True"), ("2.5", "2.5"))
        ),
    ],
)
def test_invalid_rules_are_rejected(text: str, message: str) -> None:
    with pytest.raises(forkaudit.RulesFileError, match=message.replace("[", r"\[")):
        parse_rules(text, "minimal")


def test_files_per_topic_defaults_to_20_and_reads_a_positive_value() -> None:
    assert parse_rules(MINIMAL, "minimal").files_per_topic == 20
    history = "\n[history]\nfiles_per_topic = 1\n"
    assert parse_rules(MINIMAL + history, "minimal").files_per_topic == 1


def test_the_sides_are_pinned_only_where_the_rules_pin_them() -> None:
    unpinned = parse_rules(MINIMAL, "minimal")
    assert (unpinned.fork, unpinned.upstream) == (None, None)
    pinned = parse_rules(MINIMAL + '[upstream]\nsource = "pypi:vllm==0.9.2"\n', "minimal")
    assert (pinned.fork, pinned.upstream) == (None, "pypi:vllm==0.9.2")


def test_shipped_vllm_rules_cover_the_issue_areas() -> None:
    rules = forkaudit.load_rules()
    areas = {g.area for g in rules.groups}
    assert areas == {
        "attention",
        "kv_cache",
        "quantization",
        "custom_ops",
        "platform",
        "envs",
        "ci_docker",
        "docs",
        "tests",
    }
    assert {"hygon", "dtk", "gfx9", "rocm", "int8", "fp8", "kv_cache_dtype"} <= set(rules.keywords)
    assert rules.classify("vllm/v1/core/block_pool.py").streams == ("A",)
    assert rules.classify("vllm/platforms/rocm.py").area == "platform"
    assert rules.classify("tests/kernels/test_kv_cache.py").area == "tests"

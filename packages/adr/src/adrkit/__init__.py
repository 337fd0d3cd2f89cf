"""adrkit: the results records every pipeline stage writes, and the writer that puts the figures
into the Architecture Decision Records. The record's types are in `adrkit.schema`, which imports
nothing beyond the standard library.

Stages build a `Record` and `write_record` it under a results root; `update_adrs` renders every
generated block of every ADR from the latest records, as one set and under the ADR directory's
lock.

Names are loaded when first used: `import adrkit.schema` alone never loads the writer (GitPython,
PyYAML), so kvquant's build and check name their gates without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adrkit._block_sources import BLOCK_SOURCES, BlockSource, check_records, missing_tables
    from adrkit._blocks import BLOCKS
    from adrkit._document import LANGS
    from adrkit._errors import AdrError, CommitError, MarkerError, RenderError, ResultsError
    from adrkit._evidence import (
        Evidence,
        HardwareClasses,
        hardware_class,
        load_evidence,
        load_hardware,
    )
    from adrkit._freshness import SOURCES_FILE, Sources, Stale, load_sources, source_hashes, stale
    from adrkit._markdown import markdown_table, markdown_text
    from adrkit._provenance import hardware, new_run_id, package_versions, repo_state, utc_now
    from adrkit._record import MAX_RECORD_BYTES, load_latest, read_record, write_record
    from adrkit._render import Shown, block_keys, render_block
    from adrkit._summary import Decisions, decision_rows, load_decisions, milestone_problems
    from adrkit._writer import UpdateResult, update_adrs

# Each public name and the module that defines it.
_MODULES = {
    "AdrError": "_errors",
    "BLOCKS": "_blocks",
    "BLOCK_SOURCES": "_block_sources",
    "BlockSource": "_block_sources",
    "CommitError": "_errors",
    "Decisions": "_summary",
    "Evidence": "_evidence",
    "HardwareClasses": "_evidence",
    "LANGS": "_document",
    "MAX_RECORD_BYTES": "_record",
    "MarkerError": "_errors",
    "RenderError": "_errors",
    "ResultsError": "_errors",
    "SOURCES_FILE": "_freshness",
    "Shown": "_render",
    "Sources": "_freshness",
    "Stale": "_freshness",
    "UpdateResult": "_writer",
    "block_keys": "_render",
    "check_records": "_block_sources",
    "decision_rows": "_summary",
    "hardware": "_provenance",
    "hardware_class": "_evidence",
    "load_decisions": "_summary",
    "load_evidence": "_evidence",
    "load_hardware": "_evidence",
    "load_latest": "_record",
    "load_sources": "_freshness",
    "markdown_table": "_markdown",
    "markdown_text": "_markdown",
    "milestone_problems": "_summary",
    "missing_tables": "_block_sources",
    "new_run_id": "_provenance",
    "package_versions": "_provenance",
    "read_record": "_record",
    "render_block": "_render",
    "repo_state": "_provenance",
    "source_hashes": "_freshness",
    "stale": "_freshness",
    "update_adrs": "_writer",
    "utc_now": "_provenance",
    "write_record": "_record",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'adrkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"adrkit.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "BLOCKS",
    "BLOCK_SOURCES",
    "LANGS",
    "MAX_RECORD_BYTES",
    "SOURCES_FILE",
    "AdrError",
    "BlockSource",
    "CommitError",
    "Decisions",
    "Evidence",
    "HardwareClasses",
    "MarkerError",
    "RenderError",
    "ResultsError",
    "Shown",
    "Sources",
    "Stale",
    "UpdateResult",
    "block_keys",
    "check_records",
    "decision_rows",
    "hardware",
    "hardware_class",
    "load_decisions",
    "load_evidence",
    "load_hardware",
    "load_latest",
    "load_sources",
    "markdown_table",
    "markdown_text",
    "milestone_problems",
    "missing_tables",
    "new_run_id",
    "package_versions",
    "read_record",
    "render_block",
    "repo_state",
    "source_hashes",
    "stale",
    "update_adrs",
    "utc_now",
    "write_record",
]

"""adrkit: the results records every pipeline stage writes, and the writer that puts the figures
into the Architecture Decision Records. The record's types are kvrecord's.

Stages build a `Record` and `write_record` it under a results root; `update_adrs` renders every
generated block of every ADR from the latest records, as one set and under the ADR directory's
lock.
"""

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

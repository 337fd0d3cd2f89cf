"""adrkit: the results record every pipeline stage writes, and the writer that puts the figures
into the Architecture Decision Records.

Stages build a `Record` and `write_record` it under a results root; `update_adrs` renders every
generated block of every ADR from the latest records, as one set and under the ADR directory's
lock.
"""

from adrkit._blocks import BLOCKS, markdown_table, markdown_text, render_block
from adrkit._document import LANGS
from adrkit._errors import (
    AdrError,
    CommitError,
    MarkerError,
    RecordError,
    RenderError,
    ResultsError,
)
from adrkit._provenance import hardware, new_run_id, package_versions, repo_state, utc_now
from adrkit._record import (
    MAX_RECORD_BYTES,
    SCHEMA_VERSION,
    STATUSES,
    Gate,
    Provenance,
    Record,
    Scalar,
    Status,
    Table,
    load_latest,
    read_record,
    write_record,
)
from adrkit._writer import UpdateResult, update_adrs

__all__ = [
    "BLOCKS",
    "LANGS",
    "MAX_RECORD_BYTES",
    "SCHEMA_VERSION",
    "STATUSES",
    "AdrError",
    "CommitError",
    "Gate",
    "MarkerError",
    "Provenance",
    "Record",
    "RecordError",
    "RenderError",
    "ResultsError",
    "Scalar",
    "Status",
    "Table",
    "UpdateResult",
    "hardware",
    "load_latest",
    "markdown_table",
    "markdown_text",
    "new_run_id",
    "package_versions",
    "read_record",
    "render_block",
    "repo_state",
    "update_adrs",
    "utc_now",
    "write_record",
]

"""kvrecord: the results record's schema and the one gate comparison, for every package.

Standard library only. See `kvrecord._schema` for what a record holds and how it is checked.
"""

from kvrecord._schema import (
    COMPARISONS,
    SCHEMA_VERSION,
    STATUSES,
    Gate,
    Provenance,
    Record,
    RecordError,
    RecordParts,
    Scalar,
    Status,
    Table,
    files_by_name,
    holds,
    is_artifact_name,
)

__all__ = [
    "COMPARISONS",
    "SCHEMA_VERSION",
    "STATUSES",
    "Gate",
    "Provenance",
    "Record",
    "RecordError",
    "RecordParts",
    "Scalar",
    "Status",
    "Table",
    "files_by_name",
    "holds",
    "is_artifact_name",
]

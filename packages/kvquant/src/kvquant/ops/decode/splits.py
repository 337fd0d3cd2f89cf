"""The decode's split-KV count: a cost model of the waves a split count launches, on integers
only, so the policy is tested without a device (the slots come from the compiled kernels)."""

from __future__ import annotations

import functools

# Decode programs start in waves of `slots` (SMs times the programs one SM holds, from the
# compiled kernel: the one-split variant's own for one split); a split count s costs about
#   waves(s) * (tiles per split + _SPLIT_OVERHEAD_TILES),
# the overhead being the query prologue and the partial-result epilogue. On the H200 this model
# ranked the measured split counts of batch 4/16/64 x 8k/32k in their measured order.
_SPLIT_OVERHEAD_TILES = 2


@functools.lru_cache(maxsize=4096)
def choose_num_splits(num_programs: int, num_tiles: int, slots: int, one_split_slots: int) -> int:
    """Split-KV count for decode: the cheapest under the wave model above, never an empty split.

    ``num_programs`` is the unsplit grid (sequences x kv heads), ``num_tiles`` the KV tiles of the
    longest sequence, ``slots`` the programs of the split decode the whole device holds at once,
    ``one_split_slots`` those of the one-split variant, which is what one split launches. Ties go
    to fewer splits (less partial-result traffic).
    """

    def cost(splits: int) -> int:
        per_split = -(-num_tiles // splits)
        used_splits = -(-num_tiles // per_split)
        device_slots = one_split_slots if used_splits == 1 else slots
        waves = -(-num_programs * used_splits // device_slots)
        return waves * (per_split + _SPLIT_OVERHEAD_TILES)

    best = min(range(1, max(num_tiles, 1) + 1), key=lambda splits: (cost(splits), splits))
    # Rounding: every split gets the same whole number of tiles and the last one is not empty.
    return -(-num_tiles // -(-num_tiles // best))

"""The decode's split-KV policy (`kvquant.ops.decode.splits`), on integers alone."""

from __future__ import annotations

from kvquant.ops.decode.splits import choose_num_splits


def test_split_choice_counts_the_one_split_variant_slots() -> None:
    """One split launches its own variant, which may hold fewer programs per SM than the split
    decode (H200, 16-bit cache: 8 against 12): 1536 unsplit programs then need two waves."""
    programs, tiles = 1536, 256
    assert choose_num_splits(programs, tiles, 1584, one_split_slots=1584) == 1
    assert choose_num_splits(programs, tiles, 1584, one_split_slots=1056) == 2
    # Where splitting wins anyway (batch 16 at 8k, INT8 tiles), the one-split slots change nothing.
    assert choose_num_splits(128, 128, 1056, one_split_slots=1056) == 8
    assert choose_num_splits(128, 128, 1056, one_split_slots=528) == 8

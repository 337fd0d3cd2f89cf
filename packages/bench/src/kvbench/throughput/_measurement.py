"""What a cell's figure is: a timing, or a functional check that says nothing about speed.

A cell that runs a reference path (kvquant's kernels in Triton's CPU interpreter, or kvquant's
fp32 torch reference serving vLLM's INT8 cache on the CPU) shows that the path runs, and what it
holds; its time is not a speed. Such cells are reported for their capacity and bytes, and kept out
of speed-ups, regression flags, trends and plots. The values are ids the ADR writer translates.
"""

TIMED = "timed"
INTERPRETER_CHECK = "functional-check-interpreter"
REFERENCE_CHECK = "functional-check-reference"

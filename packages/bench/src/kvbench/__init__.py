"""kvbench: what an INT8 KV cache costs in accuracy and buys in throughput.

`kvbench.accuracy` runs paired lm-eval comparisons of a 16-bit against an INT8 KV cache;
`kvbench.throughput` runs the kernel and end-to-end throughput matrices with a history.
"""

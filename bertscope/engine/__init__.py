"""The engine: segments in, batches through the model, the kernels' statistics into accumulators.

The constant below lives here, not in `loop`, because the command line reads it (`bertscope
run`'s default) without importing torch."""

WINDOW_BATCHES = 64  # batches' worth of segments sorted by length together

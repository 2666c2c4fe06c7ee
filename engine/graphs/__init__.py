"""Graph runners: a model forward of fixed structure run as one compiled graph (CPU: inductor) or one
captured CUDA graph per bucket, over the same paged KV the eager backends use. Eager stays the oracle."""

"""Graph runners: a model forward of fixed structure run as one inductor-compiled graph with symbolic
sizes, over the same paged KV the eager backends use. Eager stays the oracle."""

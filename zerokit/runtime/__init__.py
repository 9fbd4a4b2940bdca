"""What every parallelism runs on: the launcher, the rank context and its device mesh, the
communication and memory ledgers, zerokit's ring collectives and the timeline tracer."""

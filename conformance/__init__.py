"""ZeroBatch conformance suite: LLMBATCH test vectors, their generator and a runner."""

"""Operations benchmarks: throughput and fault figures of the queue, grading, vLLM and scale (docs/benchmarks/)."""

"""Judge evaluation: ProcessBench, validation accuracy, Best-of-N and chunk-reset inference."""

"""Problems and solutions in: ingest, segmentation, prompts, policy sampling, and the
synthetic sets and policy the tests and benchmarks run on."""

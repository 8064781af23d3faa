"""The annotation engine: Celery app and tasks, dispatcher, backends, grading, segmentation,
label rules, budget policies and ingestion.  It may import ``stepq.models`` only."""

"""The job queue on the workers' side: the kinds of leased work, the one runner that settles
every job, the dispatcher that publishes them, and the processes (Celery or in-process) that
run them."""

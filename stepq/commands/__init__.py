"""The CLI's commands, one module per concept, registered on the ``stepq`` group in ``base``."""

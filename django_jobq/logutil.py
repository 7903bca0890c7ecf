"""Logging set-up for the management commands: honour ``--verbosity`` without clobbering a
project's own LOGGING configuration."""

import logging

LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


def configure(verbosity: int, fmt: str = "text") -> None:
    """``fmt`` "json": one JSON object per line (``logjson.JsonFormatter``), when the project
    configured no handler of its own (its LOGGING decides otherwise)."""
    logger = logging.getLogger("django_jobq")
    logger.setLevel(LEVELS.get(verbosity, logging.DEBUG))
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        if fmt == "json":
            from .logjson import JsonFormatter

            handler.setFormatter(JsonFormatter())
        else:
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s %(process)d %(message)s")
            )
        logger.addHandler(handler)

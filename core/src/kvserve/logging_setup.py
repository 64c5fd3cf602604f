"""A default stderr handler for the ``kvserve`` logger, as vLLM has (KVSERVE_LOG_LEVEL)."""

import logging
import os


def configure_logging() -> None:
    logger = logging.getLogger("kvserve")
    if logger.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(os.environ.get("KVSERVE_LOG_LEVEL", "INFO").upper())
    logger.propagate = False

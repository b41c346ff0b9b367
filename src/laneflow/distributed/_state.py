"""The process's world group (``lf.distributed.init``), None before it."""

WORLD = None

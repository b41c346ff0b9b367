"""Interop: DLPack (producer and consumer) and numpy."""

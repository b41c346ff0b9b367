"""Backend-neutral runtime: lanes, fences, buffers, the command encoder and streams.

Nothing here knows how a backend runs work; a backend supplies :class:`Lane` and :class:`Backend`.
"""

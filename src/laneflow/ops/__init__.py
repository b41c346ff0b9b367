"""Op definitions: argument checks, shape and dtype inference, and the primitive to run.

Written once for every backend. Each public op takes ``stream=`` (a Stream, a Device or None).
"""

"""Exact references (oracle), error metrics and bounds; later: live monitoring and the numerics audit.

Nothing on the hot path imports this package.
"""

"""Coordinators: consumer groups and (later) transactions; their records in ``__consumer_offsets``."""

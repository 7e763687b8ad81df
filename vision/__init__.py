"""Placeholder package; see the issues for what lands here."""

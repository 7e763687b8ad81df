"""Reproducible training scripts for the embedded toy model zoo (``mmspec/zoo/models``)."""

"""Reproducible training scripts for the speech toy models of the zoo (synthetic speech data, the toy ASR)."""

"""Reproducible training scripts for the vision toy models of the zoo (the shapes-world caption LM pair,
the video captioner and its MSD / FLASH drafters); each writes a zoo model folder."""

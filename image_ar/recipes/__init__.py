"""Reproducible training scripts for the image-AR toy models of the zoo (VQ, class-conditional AR target,
its drafter and the quality judge); each writes into a zoo model folder."""

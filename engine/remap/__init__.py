"""Oneiros parameter remapping: when, which model, how many and which layers. No torch."""

"""Scheduling policies (FCFS, waiting-first, swapped-first, LVF). No torch."""

"""Discrete-event simulator driving the same EngineCore on a virtual clock. No torch."""

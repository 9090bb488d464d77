"""The engine process: pure-logic core, torch executor, simulator and HTTP server."""

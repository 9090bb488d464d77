"""GPU kernels, each beside a pure-torch reference implementation."""

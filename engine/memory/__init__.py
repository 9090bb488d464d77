"""Memory bookkeeping: page arena, KV block tables, host swap space. No torch."""

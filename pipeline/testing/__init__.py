"""Tools to prove a service exactly-once, run against real servers: the checker (`pipeline verify`), fault runs
(`pipeline chaos`), the process harness they use, and input generators. The runtime never imports this package."""

"""Development tools: the demo, and its reference bootstrap server (`registrar bootstrap`)."""

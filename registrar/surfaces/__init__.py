"""How people and machines reach a registrar: health endpoints, metrics, configuration from the
environment, and the `registrar` command."""

"""How people and machines reach a registrar: health, metrics, the environment, the command."""

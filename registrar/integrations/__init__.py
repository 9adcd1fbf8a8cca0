"""Integrations that put a registrar inside another runtime (loaded only on demand: importing
`registrar` imports none of them or their runtimes)."""

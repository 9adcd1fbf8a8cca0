"""Benchmarks: registrar against the upstream retry loop, side by side (`python -m benchmarks`)."""

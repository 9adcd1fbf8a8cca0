"""The version alone: protocols and surfaces read it here, not from the root (it imports them)."""

__version__ = "0.2.0"

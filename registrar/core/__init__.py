"""The engine: the state machine, timing, the transport contract and the registrar's loop.

Nothing here imports a protocol, a surface (health, metrics, CLI) or an optional dependency;
protocols are resolved by name through `registry` or passed in as a `Transport`.
"""

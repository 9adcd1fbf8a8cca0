"""SGLang's model gateway (`smg`, the successor of sgl-router) as the registry: a worker added
through its control plane and kept there (docs/gateway.md)."""

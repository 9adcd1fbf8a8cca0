"""SGLang's model gateway (`smg`, after sgl-router) as the registry (docs/gateway.md)."""

"""Development tools: a reference bootstrap server with SGLang's semantics (`registrar
bootstrap`, and the demo's), and the demo itself."""

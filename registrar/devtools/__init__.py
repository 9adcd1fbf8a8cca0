"""Development tools: a reference bootstrap server with SGLang's semantics and fault injection
(for tests, benchmarks and the demo), and the demo itself."""

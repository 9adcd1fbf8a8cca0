"""etcd v3 as the registry: the payload under a key, held by a lease this process keeps alive
(docs/etcd.md: the model, the settings, the figures)."""

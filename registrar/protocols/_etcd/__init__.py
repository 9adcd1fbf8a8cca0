"""etcd v3 as the registry: the payload under a key held by a lease (docs/etcd.md)."""

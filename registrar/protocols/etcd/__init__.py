"""etcd v3 as the registry: the payload under a key, held by a lease this process keeps alive.

Registered means "the key holds our value under a live lease". `register` grants a lease (or
reuses ours while etcd still has it) and puts the key with it; `check` keeps the lease alive and
reads the key back; between checks `wait_idle` follows a watch on the key, so a key deleted or
overwritten by someone else is seen at once rather than at the next check; `close` revokes the
lease, so the key disappears the moment the registrar stops, while a crashed process's key
disappears when its lease runs out (the TTL).

Everything goes through etcd's JSON gateway (`POST /v3/...`, keys and values base64, int64 as
strings) with one `HttpTransport` per endpoint: no gRPC stack, no new dependency. The watch is
a streaming POST whose chunked body carries one JSON message per line; it is read from a plain
socket, so that `select()` sees exactly the bytes not yet read (a buffered HTTP client hides
some from it), and so that each piece is bounded as it arrives.

See docs/etcd.md for the model, the settings and the figures.
"""

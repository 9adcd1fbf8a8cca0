"""SGLang's model gateway (`smg`, the successor of sgl-router) as the registry: a worker added
through its control plane and kept there.

The gateway keeps the workers added by `POST /workers` in memory only, and "accepted" is not
"registered": the POST answers 202 with the worker's id, then a background job probes the
worker and lists it, or fails and forgets it without telling anyone. So:

- `register` looks up the id it already has (an earlier attempt may still be in the gateway's
  queue), else POSTs, then polls `GET /workers/{id}` with a short backoff, within
  `confirm_timeout`, until the worker is listed ready. A 404 meanwhile (the job failed, or the
  gateway restarted) is a failed attempt, retried. A 409 names the worker the gateway already
  holds at our URL: it is adopted, never added twice (the gateway keys workers by URL).
- `check` reads `GET /workers/{id}`: 404 means the gateway forgot us (every id is new after a
  restart; an operator's DELETE ends the same way) and the loop registers again. Before we know
  an id (the look before the first POST, or after an answer was lost) it searches the list for
  our URL and adopts what it finds.
- Between checks it waits on the idle kept-alive connection (`HttpTransport.wait_idle`): a
  gateway process that dies closes it, and the loop checks at once instead of at the next
  interval. While a readiness check is configured it also follows the served process: a
  worker not ready for `grace` seconds is withdrawn (DELETE) and offered again once ready
  (`not_ready`, the `Gated` hook the loop calls before each attempt).
- `close` (called once when the registrar stops) drains: `DELETE /workers/{id}`, then waits,
  within `drain_timeout`, until the gateway no longer lists the worker. The gateway marks it
  draining at once (no new requests) and removes it after its settle time (5 s by default),
  while the server is still up to finish what it was sent.

The control-plane key (`--control-plane-api-keys`) is sent as a bearer token, taken from a
file read before each request or from `$REGISTRAR_GATEWAY_KEY`; it never appears in a log or a
status.

See docs/gateway.md.
"""

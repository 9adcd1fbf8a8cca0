"""A lossy, slow link in user space, for kernels without `sch_netem`: forwards IP packets
between a tun device in one network namespace and a tun device in another, dropping each with
probability LOSS and delivering the rest DELAY seconds later, in order. Both kernels' TCP stacks
see real loss and delay (retransmissions, RTO backoff).

Run as: python netns_impair.py NS_A DEV_A NS_B DEV_B DELAY LOSS SEED (root; ends on SIGTERM).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import heapq
import os
import random
import select
import struct
import sys
import time

_CLONE_NEWNET = 0x40000000
_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000
_libc = ctypes.CDLL(None, use_errno=True)


def attach(namespace: str, device: str) -> int:
    """Open the persistent tun `device` that lives in `namespace`."""
    target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if _libc.setns(target, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {namespace}")
    finally:
        os.close(target)
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", device.encode(), _IFF_TUN | _IFF_NO_PI))
    return fd


def main() -> None:
    ns_a, dev_a, ns_b, dev_b, delay_text, loss_text, seed = sys.argv[1:8]
    delay, loss = float(delay_text), float(loss_text)
    rng = random.Random(int(seed))
    a, b = attach(ns_a, dev_a), attach(ns_b, dev_b)
    other = {a: b, b: a}
    queue: list[tuple[float, int, int, bytes]] = []
    sequence = 0
    print("ready", flush=True)
    while True:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, fd, packet = heapq.heappop(queue)
            with contextlib.suppress(OSError):  # the device is gone: lost, as on a wire
                os.write(fd, packet)
        timeout = max(0.0, queue[0][0] - now) if queue else 1.0
        readable, _, _ = select.select([a, b], [], [], timeout)
        for fd in readable:
            packet = os.read(fd, 65536)
            if rng.random() < loss:
                continue
            sequence += 1
            heapq.heappush(queue, (time.monotonic() + delay, sequence, other[fd], packet))


if __name__ == "__main__":
    main()

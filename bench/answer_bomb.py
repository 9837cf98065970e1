"""The mirror's memory for one hostile shadow answer: a gzip bomb (issue 26).

    PYTHONPATH=. python bench/answer_bomb.py [--zeros-mb 400]

A fake candidate in another process answers one request with ``--zeros-mb`` MB of zeros
gzipped (~1 KB per MB, compressed a megabyte at a time), ``content-encoding: gzip``. This
process fetches it through the shadow side's client (:class:`mirror.shadow_client.ShadowAnswer`,
as :mod:`mirror.shadow` does) and prints its resident memory before and at its peak
(``VmHWM``), and what the fetch kept and raised. Run it from a checkout to measure that
checkout (``PYTHONPATH=<checkout>``): before the cap the whole bomb was decompressed and kept.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import zlib


def _rss_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(field)


def _serve(sock: socket.socket, zeros_mb: int) -> None:
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    mb = bytes(1024 * 1024)
    bomb = b"".join([*(z.compress(mb) for _ in range(zeros_mb)), z.flush()])
    conn, _ = sock.accept()
    conn.recv(65536)
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
        b"content-length: %d\r\n\r\n" % len(bomb)
    )
    try:
        conn.sendall(head + bomb)
        conn.recv(1)  # until the mirror closes
    except OSError:
        pass
    conn.close()


async def _fetch(port: int) -> None:
    from mirror.shadow_client import ShadowAnswer, request_head
    from mirror.upstream import Upstream

    pool = Upstream(f"http://127.0.0.1:{port}", connect_timeout_s=5)
    answer = ShadowAnswer(asyncio.get_running_loop().time)
    raised: BaseException | None = None
    try:
        await answer.fetch(pool, request_head("POST", "/", pool, []), b"{}")
    except Exception as exc:
        raised = exc
    kept = sum(len(p) for p in answer.parts)
    print(f"kept {kept / 2**20:.1f} MiB of the answer; raised: {raised!r}"[:200])
    pool.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zeros-mb", type=int, default=400)
    args = ap.parse_args()
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    proc = multiprocessing.get_context("fork").Process(target=_serve, args=(sock, args.zeros_mb))
    proc.start()
    import mirror.shadow_client  # noqa: F401 (imported before the baseline is read)

    before = _rss_mb("VmRSS")
    asyncio.run(_fetch(port))
    proc.join(10)
    print(f"RSS before {before:.0f} MB, peak {_rss_mb('VmHWM'):.0f} MB ({args.zeros_mb} MB bomb)")


if __name__ == "__main__":
    main()

"""A TLS front for a plaintext TCP server: the test Kafka broker behind a real TLS handshake.

Tansu 0.6.0 cannot serve TLS itself (its ``--cert`` and ``--key`` flags exclude each other, and it
needs both), so ``tests/helpers/servers.py`` puts this relay in front of it: clients connect with TLS to
``LISTEN_PORT``, which checks their certificate against ``CLIENT_CA`` when one is given, and bytes
go both ways, unchanged, to ``TARGET_PORT``. The broker advertises the relay's port, so every
connection of a Kafka client goes through it.

    python tests/helpers/tls_proxy.py LISTEN_PORT TARGET_PORT CERT KEY [CLIENT_CA]
"""

from __future__ import annotations

import asyncio
import ssl
import sys

LOOPBACK = "127.0.0.1"


async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


async def serve(listen_port: int, target_port: int, context: ssl.SSLContext) -> None:
    async def connect(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            target_reader, target_writer = await asyncio.open_connection(LOOPBACK, target_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(relay(client_reader, target_writer), relay(target_reader, client_writer))

    server = await asyncio.start_server(connect, LOOPBACK, listen_port, ssl=context)
    async with server:
        await server.serve_forever()


def server_context(cert: str, key: str, client_ca: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def main(argv: list[str]) -> None:
    listen_port, target_port, cert, key, *rest = argv
    asyncio.run(serve(int(listen_port), int(target_port), server_context(cert, key, rest[0] if rest else None)))


if __name__ == "__main__":
    main(sys.argv[1:])

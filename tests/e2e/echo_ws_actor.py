"""An actor for the end-to-end tests that speaks WebSocket only: on ``PORT``, every message
it is sent comes back, and ``bye`` closes the socket (1000). Its subprotocol is ``echo``."""

from __future__ import annotations

import asyncio
import os

from websockets.asyncio.server import ServerConnection, serve
from websockets.typing import Subprotocol


async def echo(ws: ServerConnection) -> None:
    async for message in ws:
        if message == "bye":
            await ws.close(1000)
            return
        await ws.send(message)


async def main() -> None:
    async with serve(
        echo, "127.0.0.1", int(os.environ["PORT"]), subprotocols=[Subprotocol("echo")]
    ):
        await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main())

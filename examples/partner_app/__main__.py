"""`python -m examples.partner_app [--port N]`: run the example app alone (config: PARTNER_* env)."""
from __future__ import annotations

import argparse
import asyncio
import logging
from urllib.parse import urlsplit

from examples.partner_app.config import PartnerConfig
from examples.partner_app.web import make_partner_app


async def serve(config: PartnerConfig, port: int, address: str) -> None:
    make_partner_app(config).listen(port, address=address)
    logging.getLogger("partner_app").info("example partner app on http://%s:%s/", address, port)
    await asyncio.Event().wait()


def main() -> None:
    config = PartnerConfig.from_env()
    parser = argparse.ArgumentParser(prog="python -m examples.partner_app")
    parser.add_argument("--port", type=int, default=urlsplit(config.public_url).port or 8889)
    parser.add_argument("--address", default="127.0.0.1")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(serve(config, args.port, args.address))


if __name__ == "__main__":
    main()

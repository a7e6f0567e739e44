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
    parser = argparse.ArgumentParser(
        prog="python -m examples.partner_app",
        description="The example partner app alone. Configured by the environment: PARTNER_CLIENT_ID and "
                    "PARTNER_CLIENT_SECRET (required), PARTNER_AUTH_URL, PARTNER_BASE_URL, PARTNER_PUBLIC_URL, "
                    "... (examples/partner_app/config.py).")
    parser.add_argument("--port", type=int, default=None, help="default: PARTNER_PUBLIC_URL's port, else 8889")
    parser.add_argument("--address", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    args = parser.parse_args()
    try:
        config = PartnerConfig.from_env()
    except ValueError as exc:
        parser.error(f"configuration (PARTNER_* environment): {exc}")
    if args.port is None:
        args.port = urlsplit(config.public_url).port or 8889
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(serve(config, args.port, args.address))


if __name__ == "__main__":
    main()

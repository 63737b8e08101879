"""Keep OpenSSL out of an agent that serves no TLS (issue 49: an idle agent within 30 MiB resident).

asyncio imports ``ssl`` when it is imported (``base_events``, ``selector_events`` and ``sslproto`` each try
``import ssl`` and fall back to None), and ``ssl`` maps libssl and libcrypto: about 5 MiB of the agent's
resident memory, measured here (``python -c 'import asyncio'`` with and without ``ssl`` reachable: 9.6 against
5.1 MiB).  An agent without a web config file cannot serve TLS (turning TLS on needs a restart:
exporters/webconfig.py), so :func:`import_asyncio` imports asyncio with ``ssl`` out of reach, then puts it
back within reach: asyncio's modules keep ``ssl = None`` (their TLS paths unused), and anything that
imports ``ssl`` later (a report's HTTPS client in the same process) gets the real module.  Where a web config
file is given (it may turn TLS on), or asyncio or ssl is already loaded, asyncio is imported as usual.
"""
from __future__ import annotations

import sys
from typing import Optional


def import_asyncio(web_config_file: Optional[str]) -> bool:
    """Import asyncio; without ssl where ``web_config_file`` is empty and neither is loaded yet.  True where
    asyncio was imported without ssl (this process has no TLS in asyncio until it restarts)."""
    if web_config_file or "asyncio" in sys.modules or "ssl" in sys.modules:
        import asyncio  # noqa: F401
        return False
    sys.modules["ssl"] = None   # type: ignore[assignment]  (an import of ssl raises ImportError meanwhile)
    try:
        import asyncio  # noqa: F401,F811
    finally:
        if sys.modules.get("ssl", 0) is None:
            del sys.modules["ssl"]
    return True

"""Can the Hugging Face Hub be reached? Answered in seconds, before anything tries to download.

Without network, transformers and datasets retry for ~25 s before failing; a bounded TCP probe lets
grpo_lab fail fast with a message that names the offline alternatives instead.
"""

from __future__ import annotations

import os
import socket
import threading
import urllib.parse
import urllib.request

_TRUE = {"1", "true", "yes", "on"}


def hub_offline(*variables: str) -> bool:
    """Whether the user switched the Hub off (`HF_HUB_OFFLINE` and the given variables).

    Read now, not at import: huggingface_hub.constants froze the environment when it was imported.
    """
    return any(os.environ.get(var, "").strip().lower() in _TRUE for var in ("HF_HUB_OFFLINE", *variables))


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "").strip() or "https://huggingface.co"


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the Hub host (or the HTTPS proxy in front of it) opens within ``timeout``."""
    return reachable(hub_endpoint(), timeout)


def reachable(address: str, timeout: float) -> bool:
    """Whether a TCP connection to the host of URL ``address`` (or the proxy in front of it) opens in ``timeout``.

    Only a connect, no request: a reachable host may still refuse later calls.
    """
    url = urllib.parse.urlsplit(address)
    host = url.hostname
    if not host:
        return False
    try:
        port = url.port or (80 if url.scheme == "http" else 443)
    except ValueError:  # a malformed port (in HF_ENDPOINT, WANDB_BASE_URL)
        return False
    # Behind a proxy the host itself is not directly reachable; the proxy is what must answer.
    proxy = urllib.request.getproxies().get(url.scheme or "https")
    if proxy and not urllib.request.proxy_bypass(host):
        proxy_url = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = proxy_url.hostname or host, proxy_url.port or 80
    return _tcp_connects(host, port, timeout)


def _tcp_connects(host: str, port: int, timeout: float) -> bool:
    # A thread bounds the DNS lookup too, which socket timeouts do not cover; a fast failure returns at once.
    done = threading.Event()
    connected: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                connected.append(True)
        except OSError:
            pass
        finally:
            done.set()

    threading.Thread(target=probe, name="grpo-lab-hub-probe", daemon=True).start()
    done.wait(timeout)
    return bool(connected)

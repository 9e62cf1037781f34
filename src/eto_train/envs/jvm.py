"""Stopping a simulator JVM (ScienceWorld's and TextWorldExpress's py4j hosts) quietly."""

from __future__ import annotations


def stop_jvm(proc, gateways) -> None:
    """End one JVM whether it is alive or already gone: close our gateways' sockets, then its stdin."""
    for gw in gateways:
        try:
            gw.close()  # our sockets only
        except Exception:
            pass
        # Java proxies that Python collects later (cyclic garbage) would each try to reach the
        # stopped JVM and log a connection error; with the client marked closed they do nothing.
        gw._gateway_client.is_connected = False
    try:
        proc.stdin.close()  # die_on_exit: the JVM exits when its stdin closes
        proc.wait(timeout=5)
    except Exception:
        proc.kill()
        proc.wait()

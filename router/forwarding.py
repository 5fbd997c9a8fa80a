"""Which client a request comes from when proxies (a cloud load balancer, an ingress, a
kube-proxy that rewrites addresses) stand in front of the router.

The new-streams limit is per client address (router.throttling). Behind a proxy every
connection comes from the proxy's address, so all clients would share one budget. The
router therefore believes ``X-Forwarded-For`` from the proxies it is told to trust
(``--forwarded-allow-ips``: addresses or networks, ``*`` for any), and only from them:
the client is the right-most address of the header that is not itself a trusted proxy
(each proxy appends the address it saw), so a client cannot name a stranger's address
to spend that stranger's budget, nor escape its own, unless a trusted proxy lets it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

FORWARDED_FOR = b"x-forwarded-for"
MAX_ADDRESS_CHARS = 64  # what one hop may be, as a key of the per-address buckets

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class TrustedProxies:
    def __init__(self, spec: str) -> None:
        """``spec``: comma-separated addresses or networks, or ``*``; empty: none.
        Raises ValueError naming a malformed entry."""
        entries = [entry.strip() for entry in spec.split(",") if entry.strip()]
        self.any = "*" in entries
        self.networks: list[Network] = []
        for entry in entries:
            if entry == "*":
                continue
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError as exc:
                raise ValueError(f"not an address or network: {entry!r}") from exc

    def __bool__(self) -> bool:
        return self.any or bool(self.networks)

    def trusts(self, address: str) -> bool:
        if self.any:
            return True
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self.networks)

    def client(self, peer: str, headers: Sequence[tuple[bytes, bytes]]) -> str:
        """The client's address: the peer's, or, when the peer is a trusted proxy, the
        right-most untrusted hop of ``X-Forwarded-For``."""
        if not self or not self.trusts(peer):
            return peer
        hops = [hop.strip() for name, value in headers if name.lower() == FORWARDED_FOR
                for hop in value.decode("latin-1").split(",") if hop.strip()]
        for hop in reversed(hops):
            if not self.trusts(hop):
                return hop[:MAX_ADDRESS_CHARS]
        return hops[0][:MAX_ADDRESS_CHARS] if hops else peer

"""How ``kvplan bench --url A --url B ...`` spreads one point's requests over the replicas (``--route``).

- ``round-robin``: the point's n-th request (in the order the client sends them) goes to replica ``n mod N``,
  whatever each replica still holds. It spreads *requests* evenly, not load: in a closed loop a replica that
  answers faster gets its streams back sooner, and the slower one ends up holding more of them.
- ``least-outstanding``: each request goes to the replica with the fewest requests this client has sent it and
  not yet seen end; a tie goes to the replica listed first. The split the client holds is then always the even
  one: at ``c`` in flight, no replica holds more than ``ceil(c / N)``, and the first listed holds the extra one.

Both start each point at the first replica (a router per point), so a point's first ``c`` requests go out as
``ceil((c - i) / N)`` to replica ``i``: the split the fleet prediction uses (kvplan.bench.fleet.FleetRule).
Behind a gateway (``--metrics-url``) kvplan sends every request to the gateway and does not know its split.
"""

from __future__ import annotations

from typing import Literal

from kvplan.units import cdiv

Route = Literal["round-robin", "least-outstanding", "gateway"]
ROUTES: tuple[str, ...] = ("round-robin", "least-outstanding")  # what --route takes


class Router:
    """One point's choice of replica for each request; ``pick`` when a request goes out, ``release`` when it ends."""

    def __init__(self, urls: list[str], names: list[str], route: Route):
        if not urls or len(urls) != len(names):
            raise ValueError("a router needs one name per URL")
        self.urls, self.names, self.route = list(urls), list(names), route
        self.outstanding = [0] * len(urls)
        self._sent = 0

    def pick(self) -> int:
        if self.route == "least-outstanding":
            i = min(range(len(self.urls)), key=lambda k: (self.outstanding[k], k))
        else:  # round-robin (and a gateway: one URL)
            i = self._sent % len(self.urls)
        self._sent += 1
        self.outstanding[i] += 1
        return i

    def release(self, i: int) -> None:
        self.outstanding[i] -= 1


def share(concurrency: int, replica: int, replicas: int) -> int:
    """Requests replica ``replica`` (0-based) gets of the first ``concurrency`` a point sends, one to each replica
    in turn: ``ceil((c - i) / N)``. By hand, 9 over 2 replicas: 5 to the first, 4 to the second."""
    return max(0, cdiv(concurrency - replica, replicas))

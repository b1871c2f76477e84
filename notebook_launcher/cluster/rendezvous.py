"""Several nodes meeting through torch's c10d rendezvous (``rdzv_backend="c10d"``), as torchrun does.

Every node's kernel joins the rendezvous at ``rdzv_endpoint`` (the first node to arrive on the endpoint's host
serves its store); torch's rendezvous assigns the node ranks (0..num_nodes-1). Node 0 then reserves
a port for the workers' process-group store on an address the others can reach and publishes it in the
rendezvous store; the other nodes read it. From there the launch is the static one: global rank =
node_rank * num_processes + local_rank.
"""

from __future__ import annotations

import dataclasses
import gc
import ipaddress
import socket
from datetime import timedelta

from .ports import PortReservation

MASTER_KEY = "notebook_launcher.master"  # node 0 publishes "addr:port" here, per rendezvous round
DEFAULT_JOIN_TIMEOUT_S = 600.0  # torch's default


class NodeRendezvousTimeout(TimeoutError):
    """Not every node joined the rendezvous within its timeout."""


@dataclasses.dataclass
class Meeting:
    node_rank: int
    master_addr: str
    master_port: int
    reservation: PortReservation | None  # node 0: the listening socket rank 0's store will serve on


_kept: dict[tuple, NodeRendezvous] = {}  # per (endpoint, rdzv_id, nodes, options): one for the kernel's life


class NodeRendezvous:
    """The kernel's member of one rendezvous; ``meet()`` once per attempt. Kept from launch to launch: the
    next launch (or a restart) is the next round of the same rendezvous, as a restart is in torch elastic, and
    the store that the first kernel on the endpoint's host serves stays up for the others' later launches (if
    it went away with its launch, a kernel that reconnected to it just before would wait on a dead store).
    """

    @classmethod
    def for_launch(cls, endpoint: str, run_id: str, num_nodes: int, timeout: float | None,
                   conf: dict) -> NodeRendezvous:
        key = (endpoint, run_id, num_nodes, timeout, tuple(sorted((str(k), str(v)) for k, v in conf.items())))
        if key not in _kept:
            _kept[key] = cls(endpoint, run_id, num_nodes, timeout, conf)
            _kept[key]._key = key
        return _kept[key]

    def __init__(self, endpoint: str, run_id: str, num_nodes: int, timeout: float | None, conf: dict):
        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

        self.endpoint = endpoint
        self.run_id = run_id
        self.num_nodes = num_nodes
        options = {"join_timeout": timeout or DEFAULT_JOIN_TIMEOUT_S, **conf}
        self.join_timeout = float(options["join_timeout"])
        self._params = RendezvousParameters(backend="c10d", endpoint=endpoint, run_id=run_id, min_nodes=num_nodes,
                                            max_nodes=num_nodes, **options)
        self._handler = get_rendezvous_handler(self._params)

    def meet(self) -> Meeting:
        from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError

        try:
            info = self._handler.next_rendezvous()
        except RendezvousTimeoutError as exc:
            raise NodeRendezvousTimeout(str(exc)) from exc
        store = info.store
        if info.rank == 0:
            address = advertised_address(self.endpoint)
            reservation = PortReservation("::" if ":" in address else "0.0.0.0", 0)
            store.set(MASTER_KEY, f"{address} {reservation.port}")
            return Meeting(0, address, reservation.port, reservation)
        store.set_timeout(timedelta(seconds=self.join_timeout))
        try:
            address, port = store.get(MASTER_KEY).decode().split(" ")
        except (RuntimeError, TimeoutError) as exc:  # torch's DistStoreError: node 0 never said where
            raise NodeRendezvousTimeout(f"node 0 joined the rendezvous but never published where its ranks' store "
                                        f"is (it may have stopped): {exc}") from exc
        return Meeting(info.rank, address, int(port), None)

    def forget(self) -> None:
        """After a failed meeting: stop the heartbeats and drop the handler (and the store it may serve), so the
        next launch starts afresh. The rendezvous is not marked closed: the same rdzv_id can meet again."""
        _kept.pop(getattr(self, "_key", None), None)
        stop_heartbeats = getattr(self._handler, "_stop_heartbeats", None)
        if stop_heartbeats is not None:
            stop_heartbeats()
        self._handler = self._params = None
        gc.collect()  # the store sits in reference cycles: free it here, where its server thread lives


def advertised_address(endpoint: str) -> str:
    """The address the other nodes use to reach this one: the interface that routes to the rendezvous
    endpoint (loopback for a loopback endpoint), else this host's name, as torchrun does."""
    host = endpoint.rsplit(":", 1)[0].strip("[]") if ":" in endpoint else endpoint
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        if host == "localhost":
            return "127.0.0.1"
    try:
        family, _, _, _, target = socket.getaddrinfo(host, 1, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(target[:2])  # no packet is sent: this only asks the routing table
            local = probe.getsockname()[0]
        if not ipaddress.ip_address(local).is_loopback:
            return local
    except OSError:
        pass
    return socket.getfqdn()

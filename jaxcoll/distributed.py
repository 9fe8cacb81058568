"""jaxcoll across the processes of a `jax.distributed` job: the bootstrap (docs/multiprocess.md).

jax.distributed's coordinator and key-value store are the only rendezvous: no second launcher and no port for
the user to configure. `connect()` runs once per process, when the first collective over a mesh of several
processes is lowered (every process lowers the same program, so every process gets here):

1. process 0 draws the job's random token (it names the shared-memory segments, so no other job or user can
   guess or collide with them) and publishes it;
2. every process publishes its pid, host and jaxcoll version, and reads every other process's;
3. the native runtime learns the job (`_jaxcoll.configure_world`), which also removes segments a crashed
   earlier run left behind.

A process that never publishes (it crashed, or runs another program) is named in the error after the timeout
(JAXCOLL_TIMEOUT); a process running another jaxcoll version is refused at once. A process that imports jaxcoll
without jax.distributed never calls this and runs every group in-process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import socket
import threading

import jax

import jaxcoll
from jaxcoll import _jax

_PREFIX = "jaxcoll/v1/"


@dataclasses.dataclass(frozen=True)
class World:
    """The job as jaxcoll sees it: this process's index, and every process's pid and host index (processes
    with equal host indices share a host and its /dev/shm)."""
    process: int
    pids: tuple[int, ...]
    hosts: tuple[int, ...]

    @property
    def nprocesses(self) -> int:
        return len(self.pids)


_world: World | None = None
_lock = threading.Lock()


def _host_identity() -> str:
    # JAXCOLL_HOST names the host instead: processes of one machine given different names reach each other over
    # the network transport (how a job of several hosts, each with several processes, is tested on one machine).
    if os.environ.get("JAXCOLL_HOST"):
        return "JAXCOLL_HOST=" + os.environ["JAXCOLL_HOST"]
    # The hostname alone can repeat across containers; the boot id tells two kernels (two /dev/shm) apart.
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _timeout_ms() -> int:
    from jaxcoll import runtime
    return int(runtime.default_timeout_s() * 1000)


def _forced_network() -> bool:
    # JAXCOLL_TRANSPORT=tcp puts every process on a host of its own: a peer is then reached over the network even
    # on this machine (how the network transport is tested over loopback).
    transport = os.environ.get("JAXCOLL_TRANSPORT", "")
    if transport not in ("", "tcp"):
        raise ValueError(f"jaxcoll: JAXCOLL_TRANSPORT={transport!r} is not a transport; set it to 'tcp' (every "
                         "process on a host of its own) or unset it for the default (shared memory within a host)")
    return transport == "tcp"


def _net_port() -> int:
    """JAXCOLL_NET_PORT: the port this process listens on for its network peers; 0 or unset: a free one."""
    port = os.environ.get("JAXCOLL_NET_PORT", "")
    if not port:
        return 0
    if not (port.isascii() and port.isdigit() and int(port) <= 65535):
        raise ValueError(f"jaxcoll: JAXCOLL_NET_PORT={port!r} is not a port number (0 to 65535); unset it for a "
                         "free port")
    return int(port)


def world() -> World | None:
    """The job, once `connect()` has run in this process; None before (or without jax.distributed)."""
    return _world


def connect() -> World | None:
    """Join this process to the job's other processes through jax.distributed's key-value store (once; later
    calls return the same World). None when the job has one process. Raises RuntimeError naming a process
    that does not publish within the timeout, or one that runs another jaxcoll version."""
    global _world
    if jax.process_count() == 1:
        return None
    with _lock:
        if _world is not None:
            return _world
        client = _jax.distributed_client()
        if client is None:
            raise RuntimeError(
                f"jaxcoll: this job has {jax.process_count()} processes but jax.distributed's key-value store is "
                "not available; call jax.distributed.initialize() before running jaxcoll collectives")
        me, n = jax.process_index(), jax.process_count()
        timeout = _timeout_ms()
        forced_network = _forced_network()
        if me == 0:
            client.key_value_set(_PREFIX + "token", secrets.token_hex(16))
        token = _get(client, _PREFIX + "token", timeout, "process 0", "the job's token")
        from jaxcoll import runtime
        mine = {"pid": os.getpid(), "host": _host_identity(), "version": jaxcoll.__version__,
                "presence": runtime.open_presence(token, me)}
        client.key_value_set(_PREFIX + f"process/{me}", json.dumps(mine))
        peers = [mine if q == me else json.loads(_get(client, _PREFIX + f"process/{q}", timeout, f"process {q}",
                                                      "its pid and host"))
                 for q in range(n)]
        for q, peer in enumerate(peers):
            if peer["version"] != mine["version"]:
                raise RuntimeError(f"jaxcoll: process {q} runs jaxcoll {peer['version']}, process {me} runs "
                                   f"{mine['version']}; every process of a job must run the same version")
        hosts = tuple(range(n)) if forced_network else _shared_memory_hosts(client, me, peers, token, timeout)
        pids = tuple(int(peer["pid"]) for peer in peers)
        runtime.configure_world(me, pids, hosts, token, [peer["host"].split("/")[0] for peer in peers])
        remote = [q for q in range(n) if hosts[q] != hosts[me]]
        if remote:
            _connect_network(client, me, n, remote, token, timeout)
        _world = World(me, pids, hosts)
        return _world


def agree(key: str, decide) -> str:
    """Process 0's `decide()`, in every process of the job: process 0 decides and publishes it under `key` in the
    key-value store, the others read it (within JAXCOLL_TIMEOUT). What must be the same in every process though
    each could decide it differently (a choice made from measurements) goes through here. Without a job of
    several processes it is `decide()`."""
    world_ = connect()
    if world_ is None:
        return decide()
    client = _jax.distributed_client()
    full = _PREFIX + "agree/" + key
    if world_.process == 0:
        value = decide()
        try:
            client.key_value_set(full, value)
        except Exception:  # already decided (an earlier compilation of the same cell): that value stands
            return client.blocking_key_value_get(full, _timeout_ms())
        return value
    return _get(client, full, _timeout_ms(), "process 0", f"its choice for {key!r}")


def _shared_memory_hosts(client, me: int, peers: list[dict], token: str, timeout_ms: int) -> tuple[int, ...]:
    """The host of each process: processes share one when they share /dev/shm, which each tests by reading the
    nonce in the other's presence segment (a hostname and boot id alike are not enough: containers on one kernel
    may have /dev/shm of their own). Every process publishes which peers it could read and reads everyone's, so
    all compute the same hosts: a process joins the first host whose every process it shares with both ways."""
    from jaxcoll import runtime
    n = len(peers)
    seen = [q for q in range(n) if q != me and peers[q]["host"] == peers[me]["host"] and
            runtime.read_presence(token, q) == peers[q]["presence"]]
    client.key_value_set(_PREFIX + f"shm/{me}", json.dumps(seen))
    sees = [set(seen) if q == me else set(json.loads(_get(client, _PREFIX + f"shm/{q}", timeout_ms, f"process {q}",
                                                           "which processes share its /dev/shm")))
            for q in range(n)]
    members: list[list[int]] = []
    hosts = []
    for q in range(n):
        host = next((h for h, ps in enumerate(members) if all(q in sees[p] and p in sees[q] for p in ps)), None)
        if host is None:
            host = len(members)
            members.append([])
        members[host].append(q)
        hosts.append(host)
    return tuple(hosts)


def _connect_network(client, me: int, n: int, remote: list[int], token: str, timeout_ms: int) -> None:
    """Open the network transport to the processes on other hosts: listen (JAXCOLL_NET_PORT, default a free
    port) at the address published (JAXCOLL_NET_BIND: another, such as 0.0.0.0), publish the address and port,
    read theirs and connect (csrc/net.hpp)."""
    from jaxcoll import runtime
    address = os.environ.get("JAXCOLL_NET_ADDRESS") or _address_towards(_jax.coordinator_address())
    try:
        bound = runtime.net_listen(me, os.environ.get("JAXCOLL_NET_BIND") or address, _net_port(), token)
    except (RuntimeError, ValueError) as e:
        # Tell the peers now, or they would wait out the timeout for an address that never comes.
        client.key_value_set(_PREFIX + f"net/{me}", json.dumps({"error": str(e).removeprefix("jaxcoll: ")}))
        raise
    client.key_value_set(_PREFIX + f"net/{me}", json.dumps({"address": address, "port": bound}))
    addresses, ports = [""] * n, [0] * n
    for q in remote:
        peer = json.loads(_get(client, _PREFIX + f"net/{q}", timeout_ms, f"process {q}", "its network address"))
        if "error" in peer:
            raise RuntimeError(f"jaxcoll: process {q} could not open the network transport: {peer['error']}")
        addresses[q], ports[q] = peer["address"], int(peer["port"])
    runtime.net_connect(remote, addresses, ports, timeout_ms / 1000)


def _address_towards(coordinator: str | None) -> str:
    """This host's address on the route to the coordinator (peers reach it the way they reach the
    coordinator); JAXCOLL_NET_ADDRESS overrides."""
    host = (coordinator or "127.0.0.1").rsplit(":", 1)[0].strip("[]")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))  # no packet is sent: this only picks the route
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def _get(client, key: str, timeout_ms: int, who: str, what: str) -> str:
    try:
        return client.blocking_key_value_get(key, timeout_ms)
    except Exception as e:  # jaxlib raises its own XlaRuntimeError (DEADLINE_EXCEEDED) here
        raise RuntimeError(
            f"jaxcoll: {who} did not publish {what} within {timeout_ms / 1000:g} s (key {key!r} of "
            f"jax.distributed's store; timeout set by JAXCOLL_TIMEOUT): it never started jaxcoll, crashed, or runs "
            f"a different program") from e

"""jaxcoll across the processes of a `jax.distributed` job: the bootstrap (docs/multiprocess.md).

jax.distributed's coordinator and key-value store are the only rendezvous: no second launcher and no port for
the user to configure. It happens in three steps, each where it is first needed, so a process that never runs a
collective across processes never waits for its peers:

1. `publish()`, at the first bind of a jaxcoll primitive in a job of several processes (tracing a collective):
   the job's random token (drawn by whichever process comes first; it names the shared-memory segments, so no
   other job or user can guess or collide with them), this process's presence segment, and its pid, host,
   jaxcoll version and which earlier peers share its /dev/shm. It waits for no peer.
2. `layout()`, when a collective whose groups span processes is lowered (its plan depends on the hosts): reads
   what every process published and computes the same hosts in each. It only reads.
3. `connect()`, when the runtime first compiles such a call (it runs the step registered by `publish()`), or
   when called explicitly: the native runtime learns the job (`_jaxcoll.configure_world`, which also removes
   segments a crashed earlier run left behind) and opens the network transport's connections.

A process that never publishes (it crashed, or runs another program) is named in the error after the timeout
(JAXCOLL_TIMEOUT); a process running another jaxcoll version is refused at once. A process that imports jaxcoll
without jax.distributed (or before its initialize) publishes nothing and runs every group in-process.
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


_published = False  # this process's part of the job is in the key-value store (publish())
_token = ""
_layout: World | None = None  # the job as every process published it (layout())
_host_names: tuple[str, ...] = ()
_world: World | None = None  # set once the runtime is set up for the job (connect())
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
    """The job, once the runtime is set up for it (`connect()`, which compiling a collective over a mesh of
    several processes runs); None before (or without jax.distributed)."""
    return _world


def publish() -> None:
    """Publish what this process's peers need to join it, once: the job's token, this process's presence
    segment, its pid, host and jaxcoll version, and which peers that published before it share its /dev/shm.
    Waits for no peer: the first bind of a jaxcoll primitive runs it, and a process whose collectives all stay
    within it must not wait for peers that may never run jaxcoll. Does nothing without a jax.distributed job of
    several processes (a later call publishes, once jax.distributed is initialized). Raises what stopped it (a
    presence segment it cannot create, a JAXCOLL_TRANSPORT that names no transport); a later call tries again."""
    global _published, _token
    if _published or _jax.distributed_client() is None or jax.process_count() == 1:
        return
    with _lock:
        if _published:
            return
        client = _jax.distributed_client()
        me = jax.process_index()
        forced_network = _forced_network()
        token = _job_token(client)
        from jaxcoll import runtime
        mine = {"pid": os.getpid(), "host": _host_identity(), "version": jaxcoll.__version__,
                "presence": runtime.open_presence(token, me)}
        # Its own keys: a publication that failed half-way (and is tried again) rewrites them, as they were.
        client.key_value_set(_PREFIX + f"process/{me}", json.dumps(mine), allow_overwrite=True)
        # Read after writing: of any two processes, the later to publish finds the other's record here, so every
        # pair of the job is tested by at least one of the two.
        seen = [] if forced_network else _sharing_memory(client, me, mine, token)
        client.key_value_set(_PREFIX + f"shm/{me}", json.dumps(seen), allow_overwrite=True)
        runtime.set_world_set_up(connect)
        _token, _published = token, True


def layout() -> World | None:
    """The job as its processes published it: this process's index, every process's pid and host (the same in
    every process). Waits until every process has published (`publish()`); sets nothing up. None when the job
    has one process. Raises RuntimeError naming a process that does not publish within the timeout, or one that
    runs another jaxcoll version."""
    global _layout, _host_names
    if _layout is not None:
        return _layout
    if jax.process_count() == 1:
        return None
    client = _jax.distributed_client()
    if client is None:
        raise RuntimeError(
            f"jaxcoll: this job has {jax.process_count()} processes but jax.distributed's key-value store is "
            "not available; call jax.distributed.initialize() before running jaxcoll collectives")
    publish()  # this process's own part, where no jaxcoll primitive was bound yet (an explicit connect())
    with _lock:
        if _layout is not None:
            return _layout
        me, n = jax.process_index(), jax.process_count()
        timeout = _timeout_ms()
        peers = [json.loads(_get(client, _PREFIX + f"process/{q}", timeout, f"process {q}", "its pid and host"))
                 for q in range(n)]
        for q, peer in enumerate(peers):
            if peer["version"] != peers[me]["version"]:
                raise RuntimeError(f"jaxcoll: process {q} runs jaxcoll {peer['version']}, process {me} runs "
                                   f"{peers[me]['version']}; every process of a job must run the same version")
        if _forced_network():
            hosts = tuple(range(n))
        else:
            sees = [set(json.loads(_get(client, _PREFIX + f"shm/{q}", timeout, f"process {q}",
                                        "which processes share its /dev/shm")))
                    for q in range(n)]
            hosts = _shared_memory_hosts(sees)
        _host_names = tuple(peer["host"].split("/")[0] for peer in peers)
        _layout = World(me, tuple(int(peer["pid"]) for peer in peers), hosts)
        return _layout


def connect() -> World | None:
    """Set the runtime up for the job, once (later calls return the same World): the native runtime learns the
    job's processes and hosts, and this process connects to those on other hosts. The runtime runs it when it
    compiles its first call whose group spans processes; calling it earlier is the explicit step. None when the
    job has one process. Raises RuntimeError as `layout()` does, or naming a process whose network transport
    could not open."""
    global _world
    job = layout()
    if job is None:
        return None
    with _lock:
        if _world is not None:
            return _world
        from jaxcoll import runtime
        runtime.configure_world(job.process, job.pids, job.hosts, _token, _host_names)
        remote = [q for q in range(job.nprocesses) if job.hosts[q] != job.hosts[job.process]]
        if remote:
            _connect_network(_jax.distributed_client(), job.process, job.nprocesses, remote, _token, _timeout_ms())
        _world = job
        return _world


def agree(key: str, decide) -> str:
    """Process 0's `decide()`, in every process of the job: process 0 decides and publishes it under `key` in the
    key-value store, the others read it (within JAXCOLL_TIMEOUT). What must be the same in every process though
    each could decide it differently (a choice made from measurements) goes through here. Without a job of
    several processes it is `decide()`."""
    client = _jax.distributed_client()
    if client is None or jax.process_count() == 1:
        return decide()
    full = _PREFIX + "agree/" + key
    if jax.process_index() == 0:
        value = decide()
        try:
            client.key_value_set(full, value)
        except Exception:  # already decided (an earlier compilation of the same cell): that value stands
            return client.blocking_key_value_get(full, _timeout_ms())
        return value
    return _get(client, full, _timeout_ms(), "process 0", f"its choice for {key!r}")


def _job_token(client) -> str:
    """The job's token: the first process to publish draws it; the store keeps the first value set."""
    key = _PREFIX + "token"
    try:
        client.key_value_set(key, secrets.token_hex(16))
    except Exception:  # another process drew it first (the key exists): that one stands
        pass
    return _get(client, key, _timeout_ms(), "the process that drew it", "the job's token")


def _sharing_memory(client, me: int, mine: dict, token: str) -> list[int]:
    """The processes that published before this one (those in the store now) and share its /dev/shm: a peer of the
    same host identity whose presence nonce this process reads in its own /dev/shm (a hostname and boot id alike
    are not enough: containers on one kernel may have /dev/shm of their own)."""
    from jaxcoll import runtime
    seen = []
    for key, value in client.key_value_dir_get(_PREFIX + "process/"):
        q, peer = int(key.rsplit("/", 1)[-1]), json.loads(value)
        if q != me and peer["host"] == mine["host"] and runtime.read_presence(token, q) == peer["presence"]:
            seen.append(q)
    return sorted(seen)


def _shared_memory_hosts(sees: list[set[int]]) -> tuple[int, ...]:
    """The host of each process, the same in every process: from `sees[q]`, the earlier processes that process q
    found sharing its /dev/shm. Sharing a /dev/shm goes both ways, and each pair was tested by the later of the
    two to publish (or both), so p and q share one when either found the other; a process joins the first host
    whose every process it shares with."""
    def sharing(p: int, q: int) -> bool:
        return p in sees[q] or q in sees[p]
    members: list[list[int]] = []
    hosts = []
    for q in range(len(sees)):
        host = next((h for h, ps in enumerate(members) if all(sharing(p, q) for p in ps)), None)
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

"""The address a rank's answering socket listens on, which the other machines' ranks knock on
(zerokit/runtime/node_loss.py ``_host_address``): the interface GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME names, else
the one that reaches MASTER_ADDR; never the hostname's loopback address (Debian's /etc/hosts maps the hostname to
127.0.1.1, where another machine's ranks would knock on their own loopback and call live ranks gone)."""
import socket

import pytest

from zerokit.runtime import node_loss
from zerokit.runtime.node_loss import IFNAME_VARIABLES, _host_address, _interface_address

DEBIAN_HOSTNAME_ADDRESS = "127.0.1.1"


@pytest.fixture
def debian(monkeypatch):
    """A machine whose hostname resolves to 127.0.1.1, without any interface variable set."""
    for variable in (*IFNAME_VARIABLES.values(), "MASTER_ADDR"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(socket, "gethostbyname", lambda name: DEBIAN_HOSTNAME_ADDRESS)
    return monkeypatch


def _resolving(monkeypatch, table):
    """getaddrinfo answering ``table`` (name -> IPv4 address) for AF_INET, as a resolver would."""
    def getaddrinfo(host, port, family=0, *args, **kwargs):
        if host.count(".") == 3 and host.replace(".", "").isdigit():  # an address resolves to itself
            table[host] = host
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (table[host], port or 0))]
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_the_interface_that_reaches_master_addr_not_the_hostnames_loopback(debian):
    _resolving(debian, {"node0.cluster": "10.1.2.3"})
    routes = {"10.1.2.3": "10.1.2.7"}  # this machine reaches node 0 from its interface 10.1.2.7
    debian.setattr(node_loss, "_source_address", lambda ip: routes[ip])
    debian.setenv("MASTER_ADDR", "node0.cluster")
    assert _host_address("gloo") == "10.1.2.7"
    debian.setenv("MASTER_ADDR", "10.1.2.3")
    assert _host_address("nccl") == "10.1.2.7"


def test_loopback_only_when_master_addr_is_loopback(debian):
    _resolving(debian, {"localhost": "127.0.0.1", "vm": DEBIAN_HOSTNAME_ADDRESS})
    debian.setattr(node_loss, "_source_address", lambda ip: pytest.fail(f"no route asked for a loopback {ip}"))
    for master in ("localhost", "vm", "127.0.0.1"):
        debian.setenv("MASTER_ADDR", master)
        assert _host_address("gloo") == "127.0.0.1", master


def test_the_source_address_is_the_kernels_route():
    """The UDP connect sends nothing; towards this machine's own loopback the kernel picks the loopback."""
    assert node_loss._source_address("127.0.0.1") == "127.0.0.1"


def test_the_interface_named_for_the_backend_wins(debian):
    lo = _interface_address("lo")
    if lo is None:
        pytest.skip("no IPv4 address on the loopback interface 'lo' here")
    _resolving(debian, {"node0.cluster": "10.1.2.3"})
    debian.setattr(node_loss, "_source_address", lambda ip: "10.1.2.7")
    debian.setenv("MASTER_ADDR", "node0.cluster")
    debian.setenv("GLOO_SOCKET_IFNAME", "lo")
    assert _host_address("gloo") == lo
    assert _host_address("nccl") == lo  # NCCL's variable unset: gloo's names the interface still
    debian.setenv("NCCL_SOCKET_IFNAME", "^lo")  # NCCL's exclusion names no interface: gloo's is taken
    assert _host_address("nccl") == lo
    debian.delenv("GLOO_SOCKET_IFNAME")
    assert _host_address("nccl") == "10.1.2.7"  # an exclusion alone: the route to MASTER_ADDR
    for value in ("=lo", "l", "no-such-interface,lo"):  # exact, a prefix, a list (the first that has an address)
        debian.setenv("NCCL_SOCKET_IFNAME", value)
        assert _host_address("nccl") == lo, value
    debian.setenv("NCCL_SOCKET_IFNAME", "=l")  # exactly "l": no such interface, the route
    assert _host_address("nccl") == "10.1.2.7"


def test_without_master_addr_the_hostnames_address(debian):
    assert _host_address("gloo") == DEBIAN_HOSTNAME_ADDRESS

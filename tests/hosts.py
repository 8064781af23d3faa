"""Test hosts: a worker on "another machine" without a second machine.

A ``TestHost`` is a Linux network namespace joined to this one by a veth pair, so that what
runs in it reaches PostgreSQL and Redis over a link of its own, which the test can cut and
heal.  A cut drops every packet both ways without a word (a ``blackhole`` queue on each end):
no reset, no refusal, exactly what a host behind a failed switch or a paused VM's network
sees; connections in flight hang, new ones time out.  The link uses loopback-range addresses
(``127.77.N.1`` here, ``127.77.N.2`` there), so nothing of it can leave the machine; the
kernel routes loopback-range addresses over a real link only with ``route_localnet`` and a
host route that beats loopback's ``127.0.0.0/8``, both set on the pair and gone with it.

Making namespaces needs root (CAP_NET_ADMIN) and iproute2's ``ip`` and ``tc``: CI runs as root;
``why_not`` says what is missing elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid


def why_not() -> str | None:
    """Why test hosts cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "test hosts (network namespaces) need root"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"test hosts need iproute2 ({', '.join(missing)} not found)"
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _run(*args: str) -> None:
    done = subprocess.run(list(args), capture_output=True, text=True, check=False, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")


class TestHost:
    """One namespace and its link; ``remove`` undoes everything ``create`` made."""

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        subnet = int(tag[:2], 16) % 250 + 1
        self.namespace = f"stepq-{tag}"
        self.here_link, self.there_link = f"sq{tag}r", f"sq{tag}h"
        self.address_here = f"127.77.{subnet}.1"
        """This machine's end of the link: servers the host must reach listen here too."""
        self.address_there = f"127.77.{subnet}.2"
        self.made = False

    def create(self) -> TestHost:
        _ip("netns", "add", self.namespace)
        self.made = True
        _ip("link", "add", self.here_link, "type", "veth", "peer", "name", self.there_link)
        _ip("link", "set", self.there_link, "netns", self.namespace)
        _run("sysctl", "-qw", f"net.ipv4.conf.{self.here_link}.route_localnet=1")
        _ip("addr", "add", f"{self.address_here}/30", "dev", self.here_link)
        _ip("link", "set", self.here_link, "up")
        _ip("route", "add", "table", "local", f"{self.address_there}/32", "dev", self.here_link)
        there = ("-n", self.namespace)
        _run(*self.exec_prefix(), "sysctl", "-qw", f"net.ipv4.conf.{self.there_link}.route_localnet=1")
        _ip(*there, "addr", "add", f"{self.address_there}/30", "dev", self.there_link)
        _ip(*there, "link", "set", "lo", "up")
        _ip(*there, "link", "set", self.there_link, "up")
        _ip(*there, "route", "add", "table", "local", f"{self.address_here}/32", "dev", self.there_link)
        return self

    def exec_prefix(self) -> list[str]:
        """What to put before a command to run it on the host."""
        return ["ip", "netns", "exec", self.namespace]

    def cut(self) -> None:
        """Drop every packet over the link, both ways, silently."""
        _run("tc", "qdisc", "add", "dev", self.here_link, "root", "blackhole")
        _run(*self.exec_prefix(), "tc", "qdisc", "add", "dev", self.there_link, "root", "blackhole")

    def heal(self) -> None:
        _run("tc", "qdisc", "del", "dev", self.here_link, "root")
        _run(*self.exec_prefix(), "tc", "qdisc", "del", "dev", self.there_link, "root")

    def remove(self) -> None:
        if not self.made:
            return
        subprocess.run(["ip", "link", "del", self.here_link], capture_output=True, check=False, timeout=30)
        subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True, check=False, timeout=30)
        self.made = False

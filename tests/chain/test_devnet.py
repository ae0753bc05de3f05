"""The devnet helpers: listening ports never come from the range outgoing connections use."""

from __future__ import annotations

import socket

import pytest

import chain.devnet as devnet
from chain.devnet import LISTEN_PORT_FLOOR, find_free_port, read_ephemeral_floor


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    floor = read_ephemeral_floor()
    ports = [find_free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(LISTEN_PORT_FLOOR <= p < max(floor, LISTEN_PORT_FLOOR + 1000) for p in ports)
    for p in ports[:5]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", p))


def test_a_port_bound_elsewhere_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        other = taken + 1 if taken + 1 not in devnet._issued_ports else taken - 1
        choices = iter([taken, taken, other])  # the chooser offers the held port twice, then another

        class Chooser:
            def randrange(self, lo: int, hi: int) -> int:
                return next(choices)

        monkeypatch.setattr(devnet.random, "SystemRandom", Chooser)
        assert find_free_port() == other

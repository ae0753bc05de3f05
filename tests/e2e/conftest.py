"""End-to-end fixtures: the real model, as in tests/node."""

from tests.node.conftest import smol  # noqa: F401

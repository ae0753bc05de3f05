"""Kind-1 fingerprints on a chain: the executer and the validator daemon derive the projection seed from
blockhash(request block + 1); an honest inference settles valid, one under another block hash does not."""

from pathlib import Path

import pytest

from chain.contracts import Status
from node.engines.models import ProjectionConfig
from node.errors import Reason
from node.executer.chain_mode import ChainGate
from tests.node.validator.harness import finish, harness, run, start

LAST = ProjectionConfig(layers=("last",), k=16, bits=2)


def test_an_honest_kind_1_inference_settles_valid(tiny, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tiny, tmp_path, projection=LAST) as h:
            stop, task = await start(h)
            iid = await h.infer()
            assert await h.settled(iid) is Status.VALID
            await finish(stop, task)

    run(scenario())


def test_a_projection_seeded_without_the_chains_block_hash_is_voted_invalid(tiny, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # an executer that ignores the block after the request (the zero hash, as off chain) commits another seed
    monkeypatch.setattr(ChainGate, "get_block_hash_after", lambda self, block: bytes(32))

    async def scenario() -> None:
        async with harness(tiny, tmp_path, projection=LAST) as h:
            stop, task = await start(h)
            iid = await h.infer()
            assert await h.settled(iid) is Status.INVALID
            record = h.store.get_verdict(iid)
            assert record is not None and record.reason == Reason.FINGERPRINT_SEED_MISMATCH
            await finish(stop, task)

    run(scenario())

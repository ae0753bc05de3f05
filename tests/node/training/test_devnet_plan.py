"""The SmolLM2-shaped devnet's memory plan: the shape option, K from the audit window, the recompute lock,
the shadow's vector-free serving, the auditor's float64-free norms and its kept responses."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from node.training.spec import SMOLLM2_135M, ModelShape, UnknownShape, compute_keep_checkpoints, get_shape


def test_the_shape_option_names_the_tiny_llama_and_smollm2_and_refuses_others():
    assert get_shape("tiny") == ModelShape()
    assert get_shape("smollm2") == SMOLLM2_135M
    with pytest.raises(UnknownShape):
        get_shape("gpt2")


def test_the_devnet_plan_per_shape_and_its_overrides():
    from node.training.devnet import compute_catch_probability, get_devnet_plan, make_runs

    tiny = get_devnet_plan("tiny")
    assert (tiny.steps, tiny.anchor_every, tiny.keep_checkpoints) == (20, 5, 10)  # K as before for the tiny demo
    smol = get_devnet_plan("smollm2")
    assert smol.keep_checkpoints == 2 * smol.anchor_every
    cheating = smol.steps - smol.anchor_every
    assert compute_catch_probability(smol) == pytest.approx(1 - (1 - smol.audit_rate) ** cheating)
    assert compute_catch_probability(smol) > 0.98 and smol.keep_checkpoints == 2
    runs = make_runs(get_devnet_plan("smollm2", steps=6, anchor_every=3, audit_rate=0.5))
    assert [r.spec.shape for r in runs] == [SMOLLM2_135M] * 3
    assert all(r.spec.keep_checkpoints == 6 and r.spec.anchor_every == 3 for r in runs)
    assert [c.step for c in runs[1].cheats] == [4, 5, 6] and runs[0].cheats == ()
    assert [(c.kind, c.step) for c in runs[2].cheats] == [("swap", 4), ("swap", 5), ("swap", 6)]  # hidden state
    with pytest.raises(UnknownShape):
        get_devnet_plan("huge")


@pytest.mark.parametrize("m", [1, 2, 3, 5])
def test_k_covers_every_audit_of_a_window_and_the_next_windows_request_and_no_more(m):
    """Replay the shadow's buffer: with K = compute_keep_checkpoints(m) every step's Z(t−1), Z(t) is served at its
    own anchor (on-chain draw) and at the next one (an off-chain request); with K − 1 some is not."""
    from node.protocol.ledger import InvalidTraining
    from node.training.model import TrainState
    from node.training.shadow import ShadowState
    from node.training.spec import RunSpec

    def servable(keep: int, steps: int) -> bool:
        spec = RunSpec(steps=steps, anchor_every=m, keep_checkpoints=max(2, keep))
        shadow = ShadowState(spec, TrainState(0, torch.zeros(1), torch.zeros(1)),
                             lambda s, g, t: TrainState(t, s.params + g, s.momentum))
        windows, last = [], 0
        for step in range(1, steps + 1):
            shadow.on_gradient(step, torch.ones(1))
            if step % m == 0 or step == steps:
                windows.append(range(last + 1 if last else 0, step + 1))
                last = step
                asked = [*windows[-1], *(windows[-2] if len(windows) > 1 else [])]  # drawn + requested last window
                try:
                    for s in asked:
                        assert shadow.get_state(s).step == s and (s == 0 or shadow.get_state(s - 1).step == s - 1)
                except InvalidTraining:
                    return False
        return True

    k = compute_keep_checkpoints(m)
    assert servable(k, 4 * m + 1)
    if k - 1 >= 2:
        assert not servable(k - 1, 4 * m + 1)
    assert compute_keep_checkpoints(m, offchain=False) == max(2, m)
    with pytest.raises(ValueError):
        compute_keep_checkpoints(0)


def test_the_shadow_writes_the_npy_of_z_without_building_z(tmp_path):
    from node.training.job import save_state_npy
    from node.training.model import TrainState

    state = TrainState(3, torch.randn(1000), torch.randn(1000))
    save_state_npy(tmp_path / "a.npy", state)
    with (tmp_path / "b.npy").open("wb") as f:
        np.save(f, state.vector())
    assert (tmp_path / "a.npy").read_bytes() == (tmp_path / "b.npy").read_bytes()


def test_the_chunked_relative_error_equals_the_float64_one():
    from node.training import auditor

    rng = np.random.default_rng(0)
    before = rng.standard_normal(3 * auditor.CHUNK + 17).astype(np.float32)
    mine = before + 1e-3 * rng.standard_normal(before.size).astype(np.float32)
    claimed = mine + 1e-8 * rng.standard_normal(before.size).astype(np.float32)
    exact = (np.linalg.norm(mine.astype(np.float64) - claimed) / np.linalg.norm(mine.astype(np.float64) - before))
    assert auditor.compute_relative_error(mine, claimed, before) == pytest.approx(exact, rel=1e-12)
    assert auditor.compute_relative_error(mine, mine, before) == 0.0


def test_state_from_vector_without_copy_shares_the_loaded_array():
    from node.training.model import state_from_vector

    z = np.arange(10, dtype=np.float32)
    s = state_from_vector(1, z, 5, copy=False)
    assert s.params.numpy().base is not None and np.shares_memory(s.params.numpy(), z)
    assert np.array_equal(s.vector(), z)


def _hold(lock: str, marker: str, seconds: float) -> None:
    from node.training.scheduler import hold_recompute_lock

    with hold_recompute_lock(Path(lock)):
        Path(marker).write_text(str(time.time()))
        time.sleep(seconds)
        Path(marker + ".end").write_text(str(time.time()))


def test_the_recompute_lock_serialises_processes_and_a_killed_holder_releases_it(tmp_path):
    ctx = mp.get_context("spawn")
    lock = str(tmp_path / "recompute.lock")
    a = ctx.Process(target=_hold, args=(lock, str(tmp_path / "a"), 1.0))
    a.start()
    deadline = time.monotonic() + 60
    while not (tmp_path / "a").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    b = ctx.Process(target=_hold, args=(lock, str(tmp_path / "b"), 0.0))
    b.start()
    a.join(60)
    b.join(60)
    assert float((tmp_path / "b").read_text()) >= float((tmp_path / "a.end").read_text())  # b waited for a
    killed = ctx.Process(target=_hold, args=(lock, str(tmp_path / "k"), 60.0))
    killed.start()
    while not (tmp_path / "k").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    killed.kill()
    killed.join(10)
    started = time.monotonic()
    _hold(lock, str(tmp_path / "c"), 0.0)  # the kernel dropped the dead holder's lock
    assert time.monotonic() - started < 5


def test_the_auditor_keeps_the_response_it_first_saw_and_a_later_rewrite_does_not_change_it(tmp_path):
    import os

    from node.training.service import keep_response

    served = tmp_path / "served"
    served.mkdir()
    for name, data in (("state.npy", b"Z1"), ("state_prev.npy", b"Z0"), ("batch.json", b"[]")):
        (served / name).write_bytes(data)
    kept = keep_response(served, tmp_path / "spool" / "00000001", 1)
    (served / "new.tmp").write_bytes(b"doctored")
    os.replace(served / "new.tmp", served / "state.npy")  # the prover's atomic rewrite
    assert (kept / "state.npy").read_bytes() == b"Z1" and (kept / "state_prev.npy").read_bytes() == b"Z0"
    assert keep_response(served, None, 1) == served


def test_a_shape_tolerance_is_its_own_entry_and_other_shapes_keep_the_default(tmp_path):
    from node.training.auditor import AuditTolerance, load_shape_tolerances, load_tolerance
    from node.training.calibration import Spread, write_tolerance
    from node.training.service import AuditorService
    from node.training.spec import RunSpec

    path = tmp_path / "tolerance.json"
    spread = Spread(1, 1e-6, 1e-7, 1e-7, 1e-6, 1e-6, 1.0)
    tiny, smol = AuditTolerance(1e-5, 1e-6, 1e-5, 1e-3), AuditTolerance(2e-5, 3e-6, 4e-5, 1e-3)
    write_tolerance(path, tiny, spread, {}, 10.0)
    write_tolerance(path, smol, spread, {}, 10.0, shape="smollm2")
    write_tolerance(path, tiny, spread, {}, 10.0)  # recalibrating the default keeps the shape's entry
    assert load_tolerance(path) == tiny and load_tolerance(path, "tiny") == tiny
    assert load_tolerance(path, "smollm2") == smol
    service = AuditorService(contract=None, validator=None, tolerance=tiny, trajectory=None,
                             journal=tmp_path / "j.jsonl", worker=None, shape_tolerances=load_shape_tolerances(path))
    assert service.get_tolerance(RunSpec(shape=SMOLLM2_135M)) == smol and service.get_tolerance(RunSpec()) == tiny


def test_the_memory_sampler_sums_the_process_tree(tmp_path):
    import subprocess
    import sys

    from node.training.devnet import MemorySampler

    code = "import time; b = bytearray(200 * 2**20); time.sleep(3)"  # a child holding 200 MiB
    with MemorySampler(period_s=0.1) as memory:
        child = subprocess.Popen([sys.executable, "-c", code])
        time.sleep(2.0)
        child.wait(30)
    summary = memory.summary()
    assert summary["peak_rss_bytes"] > 200 * 2**20 and summary["samples"] >= 5
    assert {"devnet", "other"} <= set(summary["peak_by_role_gb"])

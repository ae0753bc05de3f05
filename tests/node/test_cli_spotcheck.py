"""`verinfer spotcheck sim`'s exit code: a run whose measured (X, Y, Z) are not sound fails (issue 31 finding 5)."""

from node.cli_spotcheck import compute_sim_exit_code


def test_a_sim_that_is_not_sound_fails_even_when_every_cheater_was_caught() -> None:
    assert compute_sim_exit_code(True, {"sound": False}) == 1  # printed "NOT sound" and exited 0 on 404c0a8


def test_a_sound_sim_passes_only_if_exactly_the_cheaters_failed() -> None:
    assert compute_sim_exit_code(True, {"sound": True}) == 0
    assert compute_sim_exit_code(False, {"sound": True}) == 1
    assert compute_sim_exit_code(True, None) == 0  # no feasibility measured: the detection result alone

"""Calibration runs on the tiny model: the lab per claimed precision, the plan, and one honest and one attack run."""

import pytest

from node.calibrate.lab import build_lab
from node.calibrate.runs import ATTACKS, PRECISION_ATTACKS, RunSpec, attacks_for, plan_runs, run_one


def test_running_bf16_is_no_lie_when_bf16_is_claimed():
    assert attacks_for("float32") == ATTACKS
    assert set(attacks_for("bfloat16")) == set(ATTACKS) - set(PRECISION_ATTACKS)
    specs = list(plan_runs(2, 1, ("threads2",), attacks_for("bfloat16")))
    assert not {s.name for s in specs} & set(PRECISION_ATTACKS) and len(specs) == 2 + len(attacks_for("bfloat16"))


@pytest.fixture(scope="module")
def bf16_lab():
    return build_lab("tiny-llama", 16, with_other=False, dtype="bfloat16")[0]


def test_a_bf16_lab_generates_in_bf16_and_validates_in_fp32(bf16_lab):
    assert bf16_lab.honest.info.dtype == "bfloat16" and bf16_lab.validator.info.dtype == "float32"
    assert bf16_lab.generators["threads2"] is bf16_lab.honest and "bf16-as-fp32" not in bf16_lab.generators


@pytest.mark.parametrize("spec", [RunSpec("honest", "threads1", 3), RunSpec("honest", "batch4", 0),
                                  RunSpec("attack", "temperature-lie", 1)], ids=lambda s: s.key)
def test_bf16_runs_pass_stage_1_and_record_every_prefix(bf16_lab, spec):
    records = run_one(bf16_lab, spec)
    assert len(records) == (4 if spec.name == "batch4" else 1)
    for record in records:
        assert set(record["lengths"]) == {"16"} and record["lengths"]["16"]["stage1"] == "OK"
        assert record["lengths"]["16"]["weight_error_max"] >= 0


def test_a_second_campaign_never_reuses_the_first_ones_keys():
    first = {s.key for s in plan_runs(50, 4, ("threads2", "batch4"))}
    second = {s.key for s in plan_runs(50, 4, ("threads2", "batch4"), start=10_000)}
    assert len(second) == len(first) and not first & second


def test_a_torn_last_record_is_cut_before_appending(tmp_path):
    from node.calibrate.runs import drop_torn_tail, read_records

    path = tmp_path / "runs.jsonl"
    path.write_text('{"key": "a"}\n{"key": "b"}\n{"key": "c", "len')  # killed mid-write
    drop_torn_tail(path)
    assert path.read_text() == '{"key": "a"}\n{"key": "b"}\n'
    with path.open("a") as f:
        f.write('{"key": "d"}\n')
    assert [r["key"] for r in read_records(path)] == ["a", "b", "d"]
    drop_torn_tail(path)  # a whole file is left alone
    assert path.read_text().count("\n") == 3
    path.write_text('{"key": "only", "to')
    drop_torn_tail(path)
    assert path.read_text() == ""


def test_the_other_model_attacks_name_the_registry_s_other_real_model():
    from node.calibrate.lab import other_real_model
    from node.engines.models import get_model_spec

    assert other_real_model(get_model_spec("smollm2-135m-instruct")).name == "gemma-3-270m"
    assert other_real_model(get_model_spec("smollm2-135m-instruct-bf16")).name == "gemma-3-270m"  # same weights
    assert other_real_model(get_model_spec("smollm2-moe-4x135m")).name == "gemma-3-270m"  # SmolLM2's own kin
    assert other_real_model(get_model_spec("gemma-3-270m")).name == "smollm2-135m-instruct"
    assert other_real_model(get_model_spec("gemma-3-270m"), {"g": get_model_spec("gemma-3-270m")}) is None
    gemma = attacks_for("float32", "smollm2", tiny=False)
    assert {"other-model-smollm2", "prefill-smollm2/cheap-tokens", "prefill-smollm2/real-weights"} <= set(gemma)
    assert not [a for a in gemma if "gemma" in a or "tiny" in a] and len(gemma) == len(ATTACKS) - 1
    assert not [a for a in attacks_for("float32", "", tiny=True) if "{" in a or "gemma" in a]


def test_a_base_model_s_request_is_completion_text():
    from node.calibrate.runs import encode_prompt
    from node.engines.models import get_model_spec, materialise_model
    from node.engines.tokenizer import ModelTokenizer

    tokenizer = ModelTokenizer(materialise_model(get_model_spec("gemma-3-270m")).path, chat=False)
    assert encode_prompt(tokenizer, "What is 2 + 2?") == tokenizer.encode_text("What is 2 + 2?")
    injected = encode_prompt(tokenizer, "What is 2 + 2?", system="Be brief.")
    assert injected == tokenizer.encode_text("Be brief.\n\nWhat is 2 + 2?") != tokenizer.encode_text("What is 2 + 2?")

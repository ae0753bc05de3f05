"""The registered stop tokens (docs/security.md rule 3, the termination rule): those each model's generation ends on."""

import json

import pytest

from node.engines.models import ModelSpec, get_model_spec, load_registry, materialise_model
from node.engines.tokenizer import ModelTokenizer

# what the lead registers on chain with each model (ModelRegistry.stopTokensOf)
EXPECTED = {"smollm2-135m-instruct": (2,), "smollm2-135m-instruct-bf16": (2,), "gemma-3-270m": (1,),
            "tiny-llama": (2,), "smollm2-moe-4x135m": (2,), "tiny-moe": (2,), "smollm2-135m-instruct-vllm-stock": (2,)}


def test_every_registered_model_declares_its_stop_tokens():
    assert {name: spec.stop_token_ids for name, spec in load_registry().items()} == EXPECTED


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-moe", "smollm2-135m-instruct", "gemma-3-270m"])
def test_the_stop_tokens_are_the_tokenizer_and_generation_config_eos(name):
    files = materialise_model(get_model_spec(name))  # the executer's folder; its weights are not loaded here
    eos = json.loads((files.path / "generation_config.json").read_text())["eos_token_id"]
    assert frozenset(files.spec.stop_token_ids) == frozenset(eos if isinstance(eos, list) else [eos])
    assert frozenset(files.spec.stop_token_ids) == ModelTokenizer(files.path, files.spec.chat).stop_ids


@pytest.mark.parametrize("stops", [[49152], [-1], [2, 2]])
def test_a_stop_token_outside_the_vocabulary_or_repeated_is_refused(stops):
    spec = get_model_spec("tiny-llama").model_dump()
    spec["stop_token_ids"] = stops
    with pytest.raises(ValueError):
        ModelSpec(**spec)

"""Model fixtures: the tiny random llama (fast) and the real SmolLM2-135M-Instruct, loaded once."""

from dataclasses import dataclass

import pytest

from node.engines.models import ModelFiles, get_model_spec, materialise_model
from node.engines.tokenizer import ModelTokenizer
from node.engines.transformers_engine import TransformersEngine, TransformersOptions


@dataclass
class LoadedModel:
    files: ModelFiles
    tokenizer: ModelTokenizer
    engine: TransformersEngine


def load(name: str, **options) -> LoadedModel:
    spec = get_model_spec(name)
    files = materialise_model(spec)
    return LoadedModel(files, ModelTokenizer(files.path, spec.chat),
                       TransformersEngine(files.path, name, TransformersOptions(**options)))


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    return load("tiny-llama")


@pytest.fixture(scope="session")
def smol() -> LoadedModel:
    return load("smollm2-135m-instruct")

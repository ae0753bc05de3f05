import json
import os

import pytest

from node.engines.models import (
    MARKER,
    ModelSpec,
    UnknownModel,
    compute_model_id,
    default_cache_dir,
    get_model_spec,
    load_registry,
    materialise_model,
    read_marker,
)
from node.errors import Reason
from node.protocol.hashing import keccak256


def test_registry_has_the_real_models_and_a_tiny_one():
    specs = load_registry()
    assert {"smollm2-135m-instruct", "gemma-3-270m", "tiny-llama"} <= set(specs)
    smol = specs["smollm2-135m-instruct"]
    assert (smol.vocab_size, smol.k, smol.dtype, smol.chat) == (49152, 5, "float32", True)
    assert specs["gemma-3-270m"].chat is False


def test_unknown_model_is_a_typed_error():
    with pytest.raises(UnknownModel) as err:
        get_model_spec("gpt-17")
    assert err.value.reason is Reason.UNKNOWN_MODEL


def test_model_id_binds_name_and_weights():
    digest = bytes(range(32))
    assert compute_model_id("m", digest) == keccak256(b"verinfer-model-v1m\x00" + digest)
    assert compute_model_id("m", digest) != compute_model_id("n", digest)


def test_real_model_materialises_with_a_marker_and_stable_id(smol):
    marker = read_marker(smol.files.path)
    assert marker is not None and marker["name"] == "smollm2-135m-instruct"
    again = materialise_model(get_model_spec("smollm2-135m-instruct"))
    assert again.model_id == smol.files.model_id
    assert smol.engine.vocab_size == 49152


def test_interrupted_conversion_is_redone(tmp_path, tiny):
    # A cache holding the tokenizer source, plus leftovers of an interrupted tiny build.
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    os.symlink(default_cache_dir() / "models" / "smollm2-135m-instruct", cache / "models" / "smollm2-135m-instruct")
    stale = cache / "models" / "tiny-llama"
    stale.mkdir()
    (stale / "config.json").write_text("{}")  # no marker: incomplete
    (cache / "models" / "tiny-llama.partial-999").mkdir()
    files = materialise_model(get_model_spec("tiny-llama"), cache)
    assert json.loads((files.path / MARKER).read_text())["name"] == "tiny-llama"
    assert files.model_id == tiny.files.model_id  # same seed, same weights, same id
    assert materialise_model(get_model_spec("tiny-llama"), cache).path == files.path


def test_the_bf16_execution_is_its_own_registry_entry_with_its_own_profile():
    from node.profiles import load_profile

    specs = load_registry()
    fp32, bf16 = specs["smollm2-135m-instruct"], specs["smollm2-135m-instruct-bf16"]
    assert (bf16.package, bf16.gguf_file) == (fp32.package, fp32.gguf_file) and bf16.dtype == "bfloat16"
    digest = bytes(32)
    assert compute_model_id(bf16.name, digest) != compute_model_id(fp32.name, digest)  # its own α, β, reputation
    _, profile = load_profile(bf16)
    assert profile.meta.dtype == "bfloat16" and profile.meta.calibrated


def test_an_executer_cannot_run_another_precision_than_it_claims():
    from node.errors import FatalError
    from node.executer.bootstrap import ExecuterSettings, load_executer, resolve_dtype

    specs = load_registry()
    assert resolve_dtype(specs["smollm2-135m-instruct-bf16"], None) == "bfloat16"
    assert resolve_dtype(specs["smollm2-135m-instruct"], "float32") == "float32"
    with pytest.raises(FatalError, match="serve smollm2-135m-instruct-bf16 instead"):
        load_executer(ExecuterSettings("smollm2-135m-instruct", dtype="bfloat16"))


def test_the_registered_stop_tokens_are_the_ones_the_tokenizer_ends_on(tiny, smol):
    # the registry (and so the chain) declares exactly the tokens generation stops on
    for model in (tiny, smol):
        assert frozenset(model.files.spec.stop_token_ids) == model.tokenizer.stop_ids


def test_a_spec_without_stop_tokens_is_refused():
    spec = get_model_spec("tiny-llama").model_dump()
    spec["stop_token_ids"] = []
    with pytest.raises(ValueError):
        ModelSpec(**spec)


def test_an_moe_entry_names_its_builder_and_the_registry_resolves_it_only_when_asked():
    """The registry never imports the MoE room: the entry names its builder (config/models.toml)."""
    from node.engines.models import get_builder
    from node.errors import FatalError

    spec = get_model_spec("tiny-moe")
    assert spec.is_moe and spec.builder == "node.moe.model:build_moe_for_spec"
    assert get_builder(spec.builder).__name__ == "build_moe_for_spec"
    for name, builder in (("tiny-moe", None), ("tiny-llama", "node.moe.model:build_moe_for_spec")):
        raw = get_model_spec(name).model_dump()
        raw["builder"] = builder
        with pytest.raises(ValueError):  # an MoE source without one, or another source with one
            ModelSpec(**raw)
    with pytest.raises(FatalError):
        get_builder("node.moe.model:no_such_builder")

"""The real SmolLM2-135M: one decoder layer exported with weights as inputs and replayed with IREE;
the canonical sampler graph on its real logits (e2e: IREE's CPU sort makes each position ~2 s)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from node.protocol.sampler import SamplingParams
from node.protocol.seed import compute_sampler_uniforms
from node.workload.export import export_module
from node.workload.replay import is_replay_match, replay_arrays
from node.workload.sampler_graph import compile_sampler, export_sampler_graph, measure_sampler_agreement

T = 24


def test_a_smollm2_layer_replays_on_iree(smol: Any) -> None:
    torch.set_num_threads(1)
    decoder = smol.engine.model.get_decoder()
    layer = decoder.layers[15]
    ids = torch.tensor([smol.tokenizer.encode_chat([{"role": "user", "content": "Hello there, how are you?"}])[:T]])
    with torch.no_grad():
        hidden = decoder(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states[15]
        cos, sin = decoder.rotary_emb(hidden, torch.arange(ids.shape[1])[None])
    inputs = {"hidden": hidden, "cos": cos, "sin": sin}

    def call(run: Any, x: dict[str, torch.Tensor]) -> torch.Tensor:
        out: torch.Tensor = run(x["hidden"], position_embeddings=(x["cos"], x["sin"]), attention_mask=None)
        return out

    exported = export_module(layer, inputs, call, name="smollm2/layer15", output_names=["out"],
                             input_roles={"hidden": "activation"})
    assert sum(s.role == "weight" for s in exported.graph.inputs) == 9
    with torch.no_grad():
        expected = call(lambda *a, **k: layer(*a, **k), inputs).numpy()
    result = replay_arrays(exported.graph, {k: v.numpy() for k, v in exported.values.items()}, {"out": expected})
    assert is_replay_match(result), result
    wrong = expected.copy()
    wrong[0, 0, :4] *= 1.01
    assert not is_replay_match(replay_arrays(exported.graph, {k: v.numpy() for k, v in exported.values.items()},
                                             {"out": wrong}))


@pytest.mark.e2e
def test_the_sampler_graph_on_real_logits(smol: Any) -> None:
    prompt = smol.tokenizer.encode_chat([{"role": "user", "content": "Tell me about the sea."}])
    output = list(range(2000, 2012))
    logits = smol.engine.prefill(prompt, output).logits
    uniforms = compute_sampler_uniforms(b"\x07" * 32, len(output))
    compiled = compile_sampler(export_sampler_graph(smol.engine.vocab_size, 5))
    agreement = measure_sampler_agreement(compiled, [(logits[i], int(uniforms[i])) for i in range(len(output))],
                                          SamplingParams(0.7, 0.9), 5)
    # measured: picks and candidates equal at every position tried (bench: 48/48); weights rarely bit-equal
    assert agreement.chosen_equal == agreement.positions
    assert agreement.candidates_equal == agreement.positions

"""Hypothesis strategies shared by protocol and check tests."""

from dataclasses import replace

from hypothesis import strategies as st

from node.executer.synthetic import SyntheticRequest
from node.protocol.sampler import SamplingParams

params = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.5, 0.7, 1.0, 1.3]),
    top_p=st.sampled_from([1.0, 0.95, 0.9, 0.6]),
    top_k=st.sampled_from([0, 1, 3, 20]),
    max_tokens=st.just(64),
)

requests = st.builds(
    SyntheticRequest,
    inference_id=st.integers(0, 2**256 - 1),
    user_seed=st.integers(0, 2**64 - 1),
    params=params,
    prompt_token_ids=st.lists(st.integers(0, 2**32 - 1), max_size=8).map(tuple),
    k=st.integers(1, 6),
    vocab_size=st.sampled_from([8, 50, 300]),
    output_length=st.integers(0, 24),
    logit_scale=st.sampled_from([0.5, 3.0, 8.0]),
).map(lambda r: replace(r, params=replace(r.params, max_tokens=r.output_length)))
# The synthetic model has no stop token, so its honest outputs run to max_tokens (the termination rule).

# Any JSON document (what a peer can put anywhere in a message), kept small so examples stay fast.
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**300), 2**300),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=12)

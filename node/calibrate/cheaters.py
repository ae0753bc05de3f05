"""Cheating engines for end-to-end tests and the devnet: each claims the real model and is not it.

They implement the Engine interface, so a cheating operator is an ordinary executer with one of
these inside. The attacks are the calibration's (node.calibrate.runs) in engine form.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from node.calibrate.runs import forge_leaf
from node.engines.base import ClaimsIdentityOf, Engine, Generation, GenerationRequest, Prefill
from node.protocol.sampler import sample_position
from node.protocol.seed import compute_sampler_uniforms


@dataclass
class PrefillAttackEngine(ClaimsIdentityOf):
    """Text from a cheap engine; leaves and hidden states from one prefill of the real model.

    The leaves are forged so that stage 1 passes with the cheap tokens chosen (the harder variant):
    only stage 2 can tell.
    """

    cheap: Engine
    real: Engine

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Generate with the cheap engine, then dress the text in the real model's leaves."""
        out = []
        for request, cheap in zip(requests, self.cheap.generate(requests), strict=True):
            pre = self.real.prefill(request.prompt_ids, cheap.output_ids)
            v = compute_sampler_uniforms(request.run_seed, len(cheap.output_ids))
            samples = tuple(forge_leaf(sample_position(pre.logits[i], request.params, request.k, int(v[i])), token,
                                       int(v[i]), request.k) for i, token in enumerate(cheap.output_ids))
            out.append(Generation(cheap.output_ids, samples, pre.hidden, cheap.finish_reason))
        return out

    def prefill(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> Prefill:
        """Prefill with the real model."""
        return self.real.prefill(prompt_ids, output_ids)


@dataclass
class _OnTheRealModel(ClaimsIdentityOf):
    """A cheater built on the real model: claims its identity and prefills honestly."""

    real: Engine

    def prefill(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> Prefill:
        """Prefill honestly."""
        return self.real.prefill(prompt_ids, output_ids)


@dataclass
class ForgedChoiceEngine(_OnTheRealModel):
    """An honest generation whose chosen token at one position is swapped for another candidate afterwards.

    The leaf is not re-forged, so stage 1 fails at that position: a fraud proof can slash it on chain.
    """

    position: int = 1

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Generate honestly, then change one chosen token."""
        out = []
        for gen in self.real.generate(requests):
            if len(gen.samples) <= self.position:
                out.append(gen)
                continue
            s = gen.samples[self.position]
            other = next(t for t in s.token_ids if t != s.chosen)
            samples = list(gen.samples)
            samples[self.position] = replace(s, chosen=other)
            ids = list(gen.output_ids)
            ids[self.position] = other
            out.append(Generation(tuple(ids), tuple(samples), gen.hidden, gen.finish_reason))
        return out


@dataclass
class TemperatureLieEngine(_OnTheRealModel):
    """The real model sampled at a temperature other than the declared one (declared + delta).

    The leaves are the ones the real model produced at the temperature actually used, so stage 1
    passes: only the weights' mismatch with the declared temperature gives it away (stage 2).
    """

    delta: float = 0.3

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Generate each request at its declared temperature + delta."""
        return self.real.generate([replace(r, params=replace(r.params, temperature=r.params.temperature + self.delta))
                                     for r in requests])


@dataclass
class TruncatingEngine(_OnTheRealModel):
    """The real model, stopped after `keep` tokens while claiming the declared max_tokens (a cheap, cut answer).

    Every leaf is honest, so the sampler rule holds at every position: only the termination rule
    (docs/security.md rule 3: shorter than max_tokens ⇒ ends on a stop token) gives it away, in stage 1 and on chain.
    """

    keep: int = 4

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Generate at most `keep` tokens of each request."""
        return self.real.generate([replace(r, params=replace(r.params, max_tokens=min(self.keep,
                                                                                          r.params.max_tokens)))
                                     for r in requests])

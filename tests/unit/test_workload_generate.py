"""Request generation: exact lengths, valid ids, shared prefixes, seeded and reproducible."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvops.workload import (
    Alphabet,
    PlannedRequest,
    load_preset,
    make_prefixes,
    plan_iteration,
    spec_from_dict,
)
from kvops.workload.schedule import arrival_offsets_s, batch_groups


def _plan(
    name: str = "multi-shared-prefix",
    scale: float = 0.01,
    trial: int = 0,
    it: int = 0,
    run_seed: int = 0,
    order: str = "shuffled",
):
    spec = dataclasses.replace(load_preset(name).scaled(scale), request_order=order)
    alphabet = Alphabet.from_vocab_size(1000)
    prefixes = make_prefixes(spec, alphabet, run_seed)
    return spec, plan_iteration(
        spec, alphabet, prefixes, trial=trial, iteration=it, run_seed=run_seed
    )


def _by_index(planned: list[PlannedRequest]) -> dict[int, list[int]]:
    return {p.index: p.request.prompt for p in planned}  # type: ignore[misc]


def test_token_id_prompts_are_exact_and_below_vocab() -> None:
    spec, planned = _plan()
    assert len(planned) == spec.batch_size
    for p in planned:
        assert isinstance(p.request.prompt, list)
        assert len(p.request.prompt) == spec.prompt_tokens
        assert all(16 <= t < 1000 for t in p.request.prompt)
        assert p.request.output_tokens == spec.output_tokens


def test_requests_share_their_prefix_and_nothing_else() -> None:
    spec, planned = _plan()
    n = spec.prefix_tokens
    by_prefix: dict[int, list[list[int]]] = {}
    for p in planned:
        assert p.request.prefix_id == p.index % spec.num_prefixes
        by_prefix.setdefault(p.request.prefix_id or 0, []).append(p.request.prompt)  # type: ignore[arg-type]
    for prompts in by_prefix.values():
        assert all(pr[:n] == prompts[0][:n] for pr in prompts)
        assert len({tuple(pr[n:]) for pr in prompts}) == len(prompts)
    heads = {tuple(v[0][:n]) for v in by_prefix.values()}
    assert len(heads) == spec.num_prefixes


def test_same_inputs_same_prompts_new_trial_new_suffixes() -> None:
    _, a = _plan(trial=0)
    _, b = _plan(trial=0)
    _, c = _plan(trial=1)
    assert [p.request.prompt for p in a] == [p.request.prompt for p in b]
    ia, ic = _by_index(a), _by_index(c)
    assert ia[0] != ic[0]
    n = load_preset("multi-shared-prefix").scaled(0.01).prefix_tokens
    assert ia[0][:n] == ic[0][:n]


def test_a_new_run_seed_draws_new_prompts_and_a_recorded_one_repeats_them() -> None:
    """A persistent KV tier must never hold a previous run's "unique" prompts."""
    _, first = _plan("unique-one-shot", run_seed=1)
    _, again = _plan("unique-one-shot", run_seed=1)
    _, fresh = _plan("unique-one-shot", run_seed=2)
    assert _by_index(first) == _by_index(again)
    seen = {tuple(p) for p in _by_index(first).values()}
    assert not seen & {tuple(p) for p in _by_index(fresh).values()}


def test_requests_are_shuffled_within_an_iteration_unless_cyclic() -> None:
    spec, a = _plan(trial=0)
    _, again = _plan(trial=0)
    _, other_trial = _plan(trial=1)
    order = [p.index for p in a]
    assert sorted(order) == list(range(spec.per_iteration)) and order != sorted(order)
    assert order == [p.index for p in again]  # both arms of a trial: same order
    assert order != [p.index for p in other_trial]
    assert [p.batch for p in a] == [i // spec.batch_size for i in range(len(a))]
    _, cyclic = _plan(order="cyclic")
    assert [p.request.prefix_id for p in cyclic] == [
        j % spec.num_prefixes for j in range(spec.per_iteration)
    ]


def test_different_presets_draw_different_prompts() -> None:
    _, multi = _plan("multi-shared-prefix")
    _, single = _plan("single-shared-prefix")
    assert multi[0].request.prompt[:50] != single[0].request.prompt[:50]  # type: ignore[index]


def test_text_prompts_count_words_plus_specials() -> None:
    spec = spec_from_dict(
        {"num_prefixes": 2, "prefix_tokens": 20, "prompt_tokens": 30, "batch_size": 3}
    )
    alphabet = Alphabet(words=("the", "of", "and"), special_tokens=1)
    planned = plan_iteration(spec, alphabet, make_prefixes(spec, alphabet), trial=0, iteration=0)
    for p in planned:
        assert isinstance(p.request.prompt, str)
        assert len(p.request.prompt.split()) + 1 == 30


def test_unique_prompts_have_no_prefix() -> None:
    _, planned = _plan("unique-one-shot")
    assert all(p.request.prefix_id is None for p in planned)
    assert len({tuple(p.request.prompt) for p in planned}) == len(planned)


def test_batches_and_groups() -> None:
    spec = spec_from_dict(
        {"batch_size": 4, "requests_per_iteration": 10, "request_order": "cyclic"}
    )
    planned = plan_iteration(spec, Alphabet.from_vocab_size(100), [], trial=0, iteration=0)
    assert [p.batch for p in planned] == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert [list(g) for g in batch_groups(10, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_arrivals_poisson_mean_and_infinite_rate() -> None:
    spec = spec_from_dict({"rate": 50.0, "seed": 3})
    offsets = arrival_offsets_s(spec, 2001, key=(0, 0))
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert math.isclose(offsets[-1] / 2000, 1 / 50, rel_tol=0.1)
    assert offsets == arrival_offsets_s(spec, 2001, key=(0, 0))
    assert arrival_offsets_s(spec_from_dict({"rate": "inf"}), 3, key=(0,)) == [0.0, 0.0, 0.0]


def test_alphabet_round_trip() -> None:
    for a in (
        Alphabet.from_vocab_size(5000),
        Alphabet(ids=(3, 5, 9)),
        Alphabet(words=("a",), special_tokens=1),
    ):
        assert Alphabet.from_dict(a.to_dict()) == a


@settings(max_examples=30, deadline=None)
@given(
    num_prefixes=st.integers(0, 5),
    prefix=st.integers(1, 50),
    extra=st.integers(1, 50),
    vocab=st.integers(2, 5000),
)
def test_every_prompt_is_exact(num_prefixes: int, prefix: int, extra: int, vocab: int) -> None:
    spec = spec_from_dict(
        {"num_prefixes": num_prefixes, "prefix_tokens": prefix if num_prefixes else 0,
         "prompt_tokens": prefix + extra, "batch_size": 6}
    )  # fmt: skip
    alphabet = Alphabet.from_vocab_size(vocab)
    for p in plan_iteration(spec, alphabet, make_prefixes(spec, alphabet), trial=1, iteration=2):
        arr = np.asarray(p.request.prompt)
        assert arr.size == prefix + extra and arr.max() < vocab

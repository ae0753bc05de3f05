import numpy as np
import pytest

from node.protocol.ledger import InvalidTraining, TrainingReason, compute_batch_root
from node.training.corpus import compute_data_order, get_batch_ids, get_stdlib_files, load_corpus
from node.training.spec import RunSpec


def test_spec_hash_binds_every_field_and_the_nonce_seeds_the_projection():
    a = RunSpec()
    assert a.spec_hash() == RunSpec().spec_hash()
    assert a.spec_hash() != RunSpec(lr_peak=0.02).spec_hash()
    assert a.procedure_hash() != RunSpec(momentum=0.5).procedure_hash()
    assert a.procedure_hash() == RunSpec(lsh_dim=128).procedure_hash()
    assert a.lsh_seed() != RunSpec(lsh_nonce="11" * 32).lsh_seed()


def test_data_order_is_a_seeded_permutation_per_epoch():
    order = compute_data_order(7, 100, 250)
    assert len(order) == 250
    assert sorted(order[:100].tolist()) == list(range(100))
    assert np.array_equal(order, compute_data_order(7, 100, 250))
    assert not np.array_equal(order, compute_data_order(8, 100, 250))


def test_batches_split_the_global_batch_across_ranks_identically_for_two_and_four_workers():
    two = RunSpec(workers=2, batch_per_worker=2)
    four = RunSpec(workers=4, batch_per_worker=1)
    for step in (1, 5):
        a = [i for r in range(2) for i in get_batch_ids(two, 1000, step, r)]
        b = [i for r in range(4) for i in get_batch_ids(four, 1000, step, r)]
        assert a == b and len(set(a)) == 4
    with pytest.raises(InvalidTraining) as e:
        get_batch_ids(two, 1000, 0, 0)
    assert e.value.training_reason == TrainingReason.DATA_UNDECLARED


def test_corpus_is_the_stdlib_tokenised_with_a_stable_root():
    files = get_stdlib_files(4)
    assert all(f.suffix == ".py" for f in files) and files == sorted(files)
    corpus = load_corpus(4, 16)
    assert corpus.samples.shape[1] == 17 and corpus.samples.dtype == np.int64
    assert corpus.samples.max() < 49152
    assert corpus.data_root == compute_batch_root(list(range(len(corpus.samples))), corpus.samples.tolist())
    assert corpus.data_root != load_corpus(5, 16).data_root

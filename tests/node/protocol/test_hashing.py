from Crypto.Hash import keccak as pycryptodome_keccak

from node.protocol.hashing import keccak256


def test_keccak256_known_constants():
    # Ethereum's keccak256("") and keccak256("abc"), published constants.
    assert keccak256(b"").hex() == "c5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470"
    assert keccak256(b"abc").hex() == "4e03657aea45a94fc7d47ba826c8d667c0d1e6e33a64a036ec44f58fa12d6c45"


def test_keccak256_agrees_with_pycryptodome():
    for n in (1, 31, 32, 33, 135, 136, 137, 1000):
        data = bytes(range(256)) * 4
        assert keccak256(data[:n]) == pycryptodome_keccak.new(data=data[:n], digest_bits=256).digest()

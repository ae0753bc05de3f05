"""libp2p networking (py-libp2p, trio in its own thread): payload exchange between nodes."""

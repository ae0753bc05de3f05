"""Python side of the chain: contract clients, EIP-712, events, transactions. Knows nothing of models."""

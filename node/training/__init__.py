"""Training verification (issue 17): prover hooks, shadow rank, ledger, auditor and the init check."""

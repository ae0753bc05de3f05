"""verinfer node: executer and validator for verifiable LLM inference."""

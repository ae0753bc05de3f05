"""Executer mode: seeded generation that commits an artifact beside the inference engine."""

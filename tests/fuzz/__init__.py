"""Seeded fuzzers: long runs under `make fuzz`, short seeded subsets in the unit tests."""

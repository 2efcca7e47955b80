"""Unit tests of the status-reporter service (a package so module names stay unique)."""

"""The test harness: fixtures that start the real components (see ``fixtures``)."""
